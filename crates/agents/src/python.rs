//! Just enough Python to locate code: the line span of every `def` and `class` (qualified as
//! `f`, `Class.method`), found by indentation with a lexer that knows strings and brackets.
//! One implementation, so that a site's or template's `function` means the same thing to the
//! manifest validator and to the Injector engine.

/// One definition and the lines it occupies (1-based, inclusive; `start` is the `def` line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definition {
    pub name: String,
    pub start: usize,
    pub end: usize,
}

/// Every function and method (not classes) with its span, in source order. Functions nested
/// inside functions are not listed; a line inside one belongs to the enclosing function.
pub fn definitions(code: &str) -> Vec<Definition> {
    walk(code, false)
}

/// The qualified names (`f`, `Class`, `Class.method`, `Outer.Inner.m`) a module defines:
/// what a manifest's `function` may name.
pub fn qualified_names(code: &str) -> std::collections::BTreeSet<String> {
    walk(code, true).into_iter().map(|d| d.name).collect()
}

fn walk(code: &str, with_classes: bool) -> Vec<Definition> {
    struct Open {
        indent: usize,
        name: String,
        is_class: bool,
        index: Option<usize>,
    }
    let mut found: Vec<Definition> = Vec::new();
    let mut stack: Vec<Open> = Vec::new();
    let mut last_code_line = 0;
    let mut lex = Lexer::default();
    for (i, raw) in code.lines().enumerate() {
        let line_no = i + 1;
        let trimmed = raw.trim_start();
        // Lines inside a triple-quoted string or inside brackets (a multi-line signature or
        // call) continue the statement before them, whatever their indentation.
        if lex.triple.is_some() || lex.depth > 0 {
            lex.scan(raw);
            last_code_line = line_no;
            continue;
        }
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        lex.scan(raw);
        let indent = raw.len() - trimmed.len();
        while stack.last().is_some_and(|o| o.indent >= indent) {
            let open = stack.pop().expect("checked");
            if let Some(ix) = open.index {
                found[ix].end = last_code_line;
            }
        }
        last_code_line = line_no;
        let rest = trimmed.strip_prefix("async ").unwrap_or(trimmed);
        let (is_class, rest) = if let Some(r) = rest.strip_prefix("class ") {
            (true, r)
        } else if let Some(r) = rest.strip_prefix("def ") {
            (false, r)
        } else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        let inside_function = stack.iter().any(|o| !o.is_class);
        let index = if (with_classes || !is_class) && !inside_function {
            let mut qual: Vec<&str> = stack.iter().map(|o| o.name.as_str()).collect();
            qual.push(&name);
            found.push(Definition {
                name: qual.join("."),
                start: line_no,
                end: line_no,
            });
            Some(found.len() - 1)
        } else {
            None
        };
        stack.push(Open {
            indent,
            name,
            is_class,
            index,
        });
    }
    while let Some(open) = stack.pop() {
        if let Some(ix) = open.index {
            found[ix].end = last_code_line;
        }
    }
    found
}

/// Just enough of Python's lexer to know, at the end of each line, whether a triple-quoted
/// string is still open and how deep in brackets the statement is.
#[derive(Debug, Default)]
struct Lexer {
    triple: Option<&'static str>,
    depth: i32,
}

impl Lexer {
    fn scan(&mut self, line: &str) {
        let bytes = line.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if let Some(q) = self.triple {
                match bytes[i..].windows(3).position(|w| w == q.as_bytes()) {
                    Some(at) if !escaped(bytes, i + at) => {
                        i += at + 3;
                        self.triple = None;
                    }
                    Some(at) => i += at + 1,
                    None => return,
                }
                continue;
            }
            match bytes[i] {
                b'#' => return,
                b'"' | b'\'' => {
                    let q = if bytes[i] == b'"' { "\"\"\"" } else { "'''" };
                    if bytes[i..].starts_with(q.as_bytes()) {
                        self.triple = Some(q);
                        i += 3;
                        continue;
                    }
                    // A one-line string: skip to its closing quote.
                    let quote = bytes[i];
                    i += 1;
                    while i < bytes.len() && bytes[i] != quote {
                        i += if bytes[i] == b'\\' { 2 } else { 1 };
                    }
                    i += 1;
                    continue;
                }
                b'(' | b'[' | b'{' => self.depth += 1,
                b')' | b']' | b'}' => self.depth = (self.depth - 1).max(0),
                _ => {}
            }
            i += 1;
        }
    }
}

/// Whether the byte at `at` is preceded by an odd number of backslashes.
fn escaped(bytes: &[u8], at: usize) -> bool {
    bytes[..at]
        .iter()
        .rev()
        .take_while(|&&b| b == b'\\')
        .count()
        % 2
        == 1
}

/// The span of the function named `name` (`f` or `Class.method`).
pub fn find(code: &str, name: &str) -> Option<Definition> {
    definitions(code).into_iter().find(|d| d.name == name)
}

/// The innermost listed function containing `line`.
pub fn enclosing(code: &str, line: usize) -> Option<Definition> {
    definitions(code)
        .into_iter()
        .filter(|d| d.start <= line && line <= d.end)
        .min_by_key(|d| d.end - d.start)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CODE: &str = r#"import json


class StreamAssembler:
    """Assembles deltas.

def fake(): in a docstring
    """

    def feed(self, chunk):
        def helper():
            pass
        text = '''
not code
'''
        return helper

    # a comment

    async def close(self):
        pass


def run(argv):
    return 1
# trailing comment
TEMPLATE = string.Template("""\\
def not_real(): inside a string
  $x \""" still inside
""")


class Agent:
    def __init__(
        self,
        x: int = f("(", [1,
    2]),
    ) -> None:
        self.x = x

    def step(self):
        pass
"#;

    #[test]
    fn spans_follow_indentation() {
        let defs = definitions(CODE);
        let names: Vec<_> = defs
            .iter()
            .map(|d| (d.name.as_str(), d.start, d.end))
            .collect();
        assert_eq!(
            names,
            [
                ("StreamAssembler.feed", 10, 16),
                ("StreamAssembler.close", 20, 21),
                ("run", 24, 25),
                ("Agent.__init__", 34, 39),
                ("Agent.step", 41, 42),
            ]
        );
        assert_eq!(enclosing(CODE, 12).unwrap().name, "StreamAssembler.feed");
        assert_eq!(enclosing(CODE, 18), None);
        assert_eq!(find(CODE, "run").unwrap().start, 24);
    }

    #[test]
    fn qualified_names_include_classes() {
        let names = qualified_names(CODE);
        for name in [
            "StreamAssembler",
            "StreamAssembler.feed",
            "Agent",
            "Agent.__init__",
            "run",
        ] {
            assert!(names.contains(name), "{name} missing from {names:?}");
        }
        assert!(!names.contains("not_real") && !names.contains("fake"));
        assert!(!names.contains("StreamAssembler.feed.helper"));
    }
}
