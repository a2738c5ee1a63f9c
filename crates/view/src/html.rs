//! The few HTML helpers the pages need: escaping, folding of long values, the page frame with
//! its inline style sheet and script. Nothing here names an external resource.

use std::fmt::Write as _;

/// Values longer than this many characters are folded behind a `<details>`.
pub const FOLD_CHARS: usize = 400;
/// Characters of a folded value shown in its summary.
const PREVIEW_CHARS: usize = 120;

/// Appends `text` with `& < > " '` replaced by entities, so it is inert both as element
/// content and inside a quoted attribute value.
pub fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

/// `text`, escaped.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    escape_into(&mut out, text);
    out
}

/// A value as preformatted text; one longer than [`FOLD_CHARS`] is folded: its first
/// characters in the summary, the whole value when opened.
pub fn value_into(out: &mut String, text: &str) {
    let count = text.chars().count();
    if count <= FOLD_CHARS {
        out.push_str("<pre class=\"val\">");
        escape_into(out, text);
        out.push_str("</pre>");
        return;
    }
    let preview: String = text.chars().take(PREVIEW_CHARS).collect();
    out.push_str("<details class=\"fold\"><summary><code>");
    escape_into(out, &preview);
    let _ = write!(
        out,
        "</code>… <em>({count} characters)</em></summary><pre class=\"val\">"
    );
    escape_into(out, text);
    out.push_str("</pre></details>");
}

/// A string usable as a file name and an element id: ASCII letters, digits, `-` and `_` kept,
/// anything else replaced by `_`.
pub fn slug(text: &str) -> String {
    let s: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "_".into()
    } else {
        s
    }
}

/// A duration in nanoseconds, in the unit that reads best.
pub fn duration(ns: i64) -> String {
    let abs = ns.unsigned_abs();
    if abs < 1_000 {
        format!("{ns} ns")
    } else if abs < 1_000_000 {
        format!("{:.1} µs", ns as f64 / 1e3)
    } else if abs < 1_000_000_000 {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else {
        format!("{:.2} s", ns as f64 / 1e9)
    }
}

/// The page around `body`: title, a Content-Security-Policy that forbids every network load,
/// the inline style sheet and script.
pub fn page(title: &str, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + STYLE.len() + SCRIPT.len() + 512);
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    out.push_str(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'; script-src 'unsafe-inline'\">\n",
    );
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    out.push_str("<title>");
    escape_into(&mut out, title);
    out.push_str("</title>\n<style>");
    out.push_str(STYLE);
    out.push_str("</style>\n</head>\n<body>\n");
    out.push_str(body);
    out.push_str("\n<script>");
    out.push_str(SCRIPT);
    out.push_str("</script>\n</body>\n</html>\n");
    out
}

const STYLE: &str = r#"
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fff}
h1{font-size:1.4em}h2{font-size:1.2em;margin-top:1.5em;border-bottom:1px solid #ddd}
h3{font-size:1.05em}
code,pre{font-family:ui-monospace,monospace;font-size:12.5px}
pre.val{white-space:pre-wrap;word-break:break-word;background:#f6f6f6;padding:.3em .5em;margin:.2em 0;max-height:30em;overflow:auto}
.badge{display:inline-block;padding:0 .4em;border-radius:3px;font-size:11.5px;background:#eee;margin-left:.3em}
.k-agent{background:#e3ecff}.k-llm{background:#efe3ff}.k-tool{background:#e3f6e8}.k-chain{background:#fff3d6}.k-retriever{background:#e0f5f5}
.st-ERROR{background:#c62828;color:#fff}.st-OK{background:#d7f0d9}
ul.tree,ul.tree ul{list-style:none;padding-left:1.1em;margin:0;border-left:1px dotted #bbb}
ul.tree{border-left:none;padding-left:0}
details.span>summary{cursor:pointer;padding:1px 0}
li.err>details>summary .name{color:#b71c1c;font-weight:600}
li.blamed>details>summary{background:#fff59d;outline:2px solid #f9a825}
.blame{background:#f9a825;color:#000}
.meta{color:#666;font-size:12.5px}
details.fields{margin:.2em 0 .4em 1em}details.fields>summary{color:#555;cursor:pointer;font-size:12.5px}
table.kv{border-collapse:collapse;margin:.3em 0}table.kv th,table.kv td{border:1px solid #e3e3e3;padding:2px 6px;text-align:left;vertical-align:top}
table.kv th{background:#fafafa;font-weight:500;white-space:nowrap}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(380px,1fr));gap:1em}
.card{border:1px solid #ddd;border-radius:6px;padding:.6em .9em;background:#fcfcfc}
.right{color:#1b5e20;font-weight:600}.wrong{color:#b71c1c;font-weight:600}
ol.turns{padding-left:1.5em}ol.turns>li{margin-bottom:.8em}
.obs-err pre.val{background:#fdecea}
table.index{border-collapse:collapse}table.index th,table.index td{border:1px solid #ddd;padding:3px 8px}
table.index th{cursor:pointer;background:#f3f3f3;user-select:none}
.controls button{margin-right:.5em}
"#;

/// Expand/collapse buttons, a span's fields built from the data island when its fold first
/// opens (long values folded as [`value_into`] folds them), and the index's column sort. Plain
/// DOM, no libraries; values go in as text, never as markup.
const SCRIPT: &str = r#"
(function(){
  var FOLD=400, PREVIEW=120, fields=null;
  function value(text){
    var pre=document.createElement('pre');pre.className='val';pre.textContent=text;
    var n=Array.from(text).length;
    if(n<=FOLD)return pre;
    var d=document.createElement('details');d.className='fold';
    var s=document.createElement('summary');var c=document.createElement('code');
    c.textContent=Array.from(text).slice(0,PREVIEW).join('');
    var em=document.createElement('em');em.textContent='('+n+' characters)';
    s.appendChild(c);s.appendChild(document.createTextNode('\u2026 '));s.appendChild(em);
    d.appendChild(s);d.appendChild(pre);return d;
  }
  document.addEventListener('toggle',function(e){
    var d=e.target;
    if(!d.classList||!d.classList.contains('fields')||!d.open||d.hasAttribute('data-filled'))return;
    if(fields===null){var el=document.getElementById('span-fields');fields=el?JSON.parse(el.textContent):[];}
    var t=document.createElement('table');t.className='kv';
    (fields[+d.getAttribute('data-fields')]||[]).forEach(function(r){
      var tr=t.insertRow();var th=document.createElement('th');th.textContent=r[0];tr.appendChild(th);
      tr.insertCell().appendChild(value(r[1]));
    });
    d.appendChild(t);d.setAttribute('data-filled','');
  },true);
  document.querySelectorAll('button[data-tree]').forEach(function(b){
    b.addEventListener('click',function(){
      var open=b.getAttribute('data-tree')==='open';
      document.querySelectorAll('details.span').forEach(function(d){d.open=open;});
    });
  });
  document.querySelectorAll('table.sortable').forEach(function(t){
    t.querySelectorAll('th').forEach(function(th,i){
      var asc=true;
      th.addEventListener('click',function(){
        var body=t.tBodies[0];
        var rows=Array.prototype.slice.call(body.rows);
        rows.sort(function(a,b){
          var x=a.cells[i].getAttribute('data-sort')||a.cells[i].textContent;
          var y=b.cells[i].getAttribute('data-sort')||b.cells[i].textContent;
          return asc?x.localeCompare(y,undefined,{numeric:true}):y.localeCompare(x,undefined,{numeric:true});
        });
        asc=!asc;
        rows.forEach(function(r){body.appendChild(r);});
      });
    });
  });
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            escape(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn long_values_fold() {
        let mut out = String::new();
        value_into(&mut out, &"x".repeat(FOLD_CHARS + 1));
        assert!(out.starts_with("<details class=\"fold\">"), "{out}");
        let mut out = String::new();
        value_into(&mut out, "short");
        assert_eq!(out, "<pre class=\"val\">short</pre>");
    }

    #[test]
    fn slugs_and_durations() {
        assert_eq!(slug("ab/../c d"), "ab____c_d");
        assert_eq!(duration(1_500_000), "1.5 ms");
        assert_eq!(duration(2_500_000_000), "2.50 s");
    }
}
