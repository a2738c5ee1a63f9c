//! The span tree: one `<details class="span">` per span, nested under its parent, open for
//! the first two levels (and on the path to a blamed span), closed below. Built with an
//! explicit stack, so time is linear in the spans and deep traces cannot overflow the stack.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::Value;
use traces::Span;

use crate::html::{duration, escape_into, slug};

/// Levels of the tree shown open: roots (depth 0) and their children (depth 1); spans at depth
/// 2 and below start closed.
pub const OPEN_DEPTH: usize = 2;

/// Children of one span listed before the rest are folded, in chunks of this many: a flat
/// trace of 10,000 tool calls opens on 100 rows, not 10,000.
pub const CHILDREN_SHOWN: usize = 100;

/// Parent/child links of a span list, by index.
pub struct Tree {
    pub children: Vec<Vec<usize>>,
    pub parent: Vec<Option<usize>>,
    pub roots: Vec<usize>,
}

impl Tree {
    /// Spans whose parent is absent (or themselves) are roots; order is the input's.
    pub fn new(spans: &[Span]) -> Tree {
        let by_id: HashMap<&str, usize> = spans
            .iter()
            .enumerate()
            .map(|(i, s)| (s.span_id.as_str(), i))
            .collect();
        let mut children = vec![Vec::new(); spans.len()];
        let mut parent = vec![None; spans.len()];
        let mut roots = Vec::new();
        for (i, s) in spans.iter().enumerate() {
            match s.parent_span_id.as_deref().and_then(|p| by_id.get(p)) {
                Some(&p) if p != i => {
                    children[p].push(i);
                    parent[i] = Some(p);
                }
                _ => roots.push(i),
            }
        }
        Tree {
            children,
            parent,
            roots,
        }
    }

    /// Whether each span lies on the path from a root to one of `marked` (itself included).
    fn on_path(&self, marked: &[usize]) -> Vec<bool> {
        let mut on = vec![false; self.parent.len()];
        for &m in marked {
            let mut cur = Some(m);
            // Stops at the first span already marked, so each span is visited once overall
            // (and a parent cycle cannot loop).
            while let Some(i) = cur {
                if on[i] {
                    break;
                }
                on[i] = true;
                cur = self.parent[i];
            }
        }
        on
    }
}

/// The element id of a span's tree node.
pub fn anchor(span: &Span) -> String {
    format!("span-{}", slug(&span.span_id))
}

/// One step of the tree's depth-first rendering.
enum Step {
    Enter(usize, usize),
    Leave(bool),
    /// A fold around siblings `from..=to` (1-based, as the summary shows them) of `of`.
    ChunkOpen {
        from: usize,
        to: usize,
        of: usize,
        open: bool,
    },
    ChunkClose,
}

/// The steps that render `siblings` at `depth`, in order: the first [`CHILDREN_SHOWN`] as they
/// are, the rest in folded chunks of that many (open when one holds a span on a blamed path).
fn siblings_steps(siblings: &[usize], depth: usize, on_path: &[bool]) -> Vec<Step> {
    let n = siblings.len();
    let mut items = Vec::with_capacity(n + 2 * (n / CHILDREN_SHOWN + 1));
    for (j, &c) in siblings.iter().enumerate() {
        if j >= CHILDREN_SHOWN && (j - CHILDREN_SHOWN) % CHILDREN_SHOWN == 0 {
            let to = (j + CHILDREN_SHOWN).min(n);
            items.push(Step::ChunkOpen {
                from: j + 1,
                to,
                of: n,
                open: siblings[j..to].iter().any(|&k| on_path[k]),
            });
        }
        items.push(Step::Enter(c, depth));
        if j >= CHILDREN_SHOWN && ((j + 1 - CHILDREN_SHOWN) % CHILDREN_SHOWN == 0 || j + 1 == n) {
            items.push(Step::ChunkClose);
        }
    }
    items
}

/// Renders the tree. `blamed[i]` lists the detectors that blame span `i` (highlighted, with
/// its ancestors opened).
pub fn render(out: &mut String, spans: &[Span], blamed: &[Vec<String>]) {
    let tree = Tree::new(spans);
    let marked: Vec<usize> = (0..spans.len())
        .filter(|&i| blamed.get(i).is_some_and(|b| !b.is_empty()))
        .collect();
    let on_path = tree.on_path(&marked);
    let mut visited = vec![false; spans.len()];
    out.push_str("<ul class=\"tree\">\n");
    // Roots first, then whatever a parent cycle kept out of reach of every root.
    let mut stack: Vec<Step> = siblings_steps(&tree.roots, 0, &on_path);
    stack.reverse();
    for start in std::iter::once(None).chain((0..spans.len()).map(Some)) {
        match start {
            Some(i) if !visited[i] => stack.push(Step::Enter(i, 0)),
            Some(_) => continue,
            None => {}
        }
        while let Some(step) = stack.pop() {
            match step {
                Step::Leave(has_children) => {
                    if has_children {
                        out.push_str("</ul>");
                    }
                    out.push_str("</details></li>\n");
                }
                Step::ChunkOpen { from, to, of, open } => {
                    let _ = writeln!(
                        out,
                        "<li class=\"more\"><details{}><summary>spans {from}–{to} of {of}</summary><ul>",
                        if open { " open" } else { "" }
                    );
                }
                Step::ChunkClose => out.push_str("</ul></details></li>\n"),
                Step::Enter(i, depth) => {
                    if visited[i] {
                        continue;
                    }
                    visited[i] = true;
                    let kids: Vec<usize> = tree.children[i]
                        .iter()
                        .copied()
                        .filter(|&c| !visited[c])
                        .collect();
                    let by = blamed.get(i).map(Vec::as_slice).unwrap_or(&[]);
                    node_open(
                        out,
                        &spans[i],
                        i,
                        depth,
                        depth < OPEN_DEPTH || on_path[i],
                        by,
                    );
                    if !kids.is_empty() {
                        out.push_str("<ul>\n");
                    }
                    stack.push(Step::Leave(!kids.is_empty()));
                    stack.extend(siblings_steps(&kids, depth + 1, &on_path).into_iter().rev());
                }
            }
        }
    }
    out.push_str("</ul>\n");
    // The data island: every span's field rows, by index (the script builds a span's table
    // when its fold opens; a 10,000-span page would otherwise carry ~20 MB of tables).
    let rows: Vec<Vec<(String, String)>> = spans.iter().map(field_rows).collect();
    out.push_str("<script type=\"application/json\" id=\"span-fields\">");
    out.push_str(&script_json(&rows));
    out.push_str("</script>\n");
}

/// A node's opening: `<li>`, `<details>`, the summary line and the fields on demand.
fn node_open(
    out: &mut String,
    s: &Span,
    index: usize,
    depth: usize,
    open: bool,
    blamed_by: &[String],
) {
    let mut class = String::from("span");
    if s.is_error() {
        class.push_str(" err");
    }
    if !blamed_by.is_empty() {
        class.push_str(" blamed");
    }
    let _ = write!(out, "<li class=\"{class}\" id=\"{}\">", anchor(s));
    let _ = write!(
        out,
        "<details class=\"span\" data-depth=\"{depth}\"{}><summary>",
        if open { " open" } else { "" }
    );
    out.push_str("<span class=\"name\">");
    escape_into(out, &s.name);
    out.push_str("</span>");
    let kind = s.kind.as_str();
    let _ = write!(out, "<span class=\"badge k-{kind}\">{kind}</span>");
    if let Some(agent) = &s.agent_name {
        out.push_str("<span class=\"badge\">");
        escape_into(out, agent);
        out.push_str("</span>");
    }
    out.push_str("<span class=\"meta\">");
    if let Some(ns) = s.duration_ns() {
        let _ = write!(out, " · {}", duration(ns));
    }
    if s.input_tokens.is_some() || s.output_tokens.is_some() {
        let t = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_else(|| "–".into());
        let _ = write!(out, " · {}→{} tok", t(s.input_tokens), t(s.output_tokens));
    }
    out.push_str("</span>");
    let status = s.status.as_str();
    let _ = write!(out, "<span class=\"badge st-{status}\">{status}</span>");
    if s.is_error() {
        if let Some(e) = s.error_type.as_deref().or(s.status_message.as_deref()) {
            out.push_str(" <span class=\"meta\">");
            let short: String = e.chars().take(80).collect();
            escape_into(out, &short);
            out.push_str("</span>");
        }
    }
    if !blamed_by.is_empty() {
        out.push_str("<span class=\"badge blame\">blamed by ");
        escape_into(out, &blamed_by.join(", "));
        out.push_str("</span>");
    }
    out.push_str("</summary>");
    // The fields themselves are in the page's data island, built into a table when opened.
    let _ = write!(
        out,
        "<details class=\"fields\" data-fields=\"{index}\"><summary>attributes, input, output</summary></details>"
    );
}

/// Everything else about a span, as (name, value) rows: shown when its fold is opened.
fn field_rows(s: &Span) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    let mut row = |key: &str, value: &str| rows.push((key.to_owned(), value.to_owned()));
    row("span_id", &s.span_id);
    if let Some(p) = &s.parent_span_id {
        row("parent_span_id", p);
    }
    let opt = |v: &Option<String>| v.clone();
    let num = |v: Option<i64>| v.map(|v| v.to_string());
    let code = match (&s.code_filepath, &s.code_function, s.code_lineno) {
        (None, None, None) => None,
        (f, func, line) => Some(format!(
            "{}{}{}",
            f.as_deref().unwrap_or("?"),
            line.map(|l| format!(":{l}")).unwrap_or_default(),
            func.as_deref()
                .map(|f| format!(" ({f})"))
                .unwrap_or_default()
        )),
    };
    let named: [(&str, Option<String>); 13] = [
        ("start_time_ns", num(s.start_time_ns)),
        ("end_time_ns", num(s.end_time_ns)),
        ("status_message", opt(&s.status_message)),
        ("error_type", opt(&s.error_type)),
        ("error_message", opt(&s.error_message)),
        ("model", opt(&s.model)),
        ("tool_name", opt(&s.tool_name)),
        ("tool_arguments", opt(&s.tool_arguments)),
        ("code", code),
        ("step", num(s.step)),
        ("input", opt(&s.input)),
        ("output", opt(&s.output)),
        (
            "events",
            (!s.events.is_empty()).then(|| Value::Array(s.events.clone()).to_string()),
        ),
    ];
    for (key, value) in named {
        if let Some(v) = value {
            row(key, &v);
        }
    }
    for (key, value) in &s.attributes {
        let text = match value {
            Value::String(v) => v.clone(),
            other => other.to_string(),
        };
        row(key, &text);
    }
    rows
}

/// `value` as JSON that is inert inside a `<script>` element: `<`, `>` and `&` are written as
/// JSON escapes, so no `</script>` or `<!--` can occur in it.
fn script_json(value: &[Vec<(String, String)>]) -> String {
    let json = serde_json::to_string(value).expect("field rows serialise");
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            c => out.push(c),
        }
    }
    out
}
