//! Python for the engine: where a function lies (shared with the manifest validator, in
//! `agents::python`) and a syntax check through the interpreter.

use std::io::Write;
use std::process::{Command, Stdio};

pub use agents::python::{definitions, enclosing, find, Definition};

/// A long-lived `python3` that parses one source after another, so checking hundreds of
/// edits costs one interpreter start instead of hundreds.
#[derive(Debug)]
pub struct SyntaxChecker {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

const CHECKER: &str = r#"
import ast, sys
inp, out = sys.stdin.buffer, sys.stdout
while True:
    header = inp.readline()
    if not header:
        break
    size = int(header)
    name = inp.readline().decode().rstrip("\n")
    src = inp.read(size)
    try:
        ast.parse(src, name)
        out.write("OK\n")
    except SyntaxError as e:
        out.write(f"line {e.lineno}: {e.msg}".replace("\n", " ") + "\n")
    out.flush()
"#;

impl SyntaxChecker {
    pub fn start(python: &str) -> std::io::Result<SyntaxChecker> {
        let mut child = Command::new(python)
            .args(["-c", CHECKER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
        Ok(SyntaxChecker {
            child,
            stdin,
            stdout,
        })
    }

    /// `Ok(None)` when `code` parses, `Ok(Some(message))` for a syntax error.
    pub fn check(&mut self, filename: &str, code: &str) -> std::io::Result<Option<String>> {
        use std::io::BufRead;
        let name = filename.replace('\n', " ");
        write!(self.stdin, "{}\n{name}\n", code.len())?;
        self.stdin.write_all(code.as_bytes())?;
        self.stdin.flush()?;
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the syntax checker exited",
            ));
        }
        let line = line.trim_end();
        Ok(if line == "OK" {
            None
        } else {
            Some(line.to_owned())
        })
    }
}

impl Drop for SyntaxChecker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Checks that `code` parses as Python, with `python` (`python3`). `Ok(None)` means it
/// parses; `Ok(Some(message))` is the interpreter's syntax error; `Err` means the interpreter
/// could not be run at all.
pub fn syntax_error(python: &str, filename: &str, code: &str) -> std::io::Result<Option<String>> {
    let mut child = Command::new(python)
        .args([
            "-c",
            "import ast, sys\n\
             try:\n    ast.parse(sys.stdin.buffer.read(), sys.argv[1])\n\
             except SyntaxError as e:\n    print(f'line {e.lineno}: {e.msg}'); sys.exit(1)",
            filename,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(code.as_bytes())?;
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(None)
    } else {
        let mut msg = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if msg.is_empty() {
            msg = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        }
        Ok(Some(msg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax_check_uses_the_interpreter() {
        assert_eq!(syntax_error("python3", "x.py", "x = 1\n").unwrap(), None);
        let err = syntax_error("python3", "x.py", "def f(:\n")
            .unwrap()
            .unwrap();
        assert!(err.contains("line 1"), "{err}");
        assert!(syntax_error("no-such-python-here", "x.py", "").is_err());
        let mut checker = SyntaxChecker::start("python3").unwrap();
        for _ in 0..2 {
            assert_eq!(checker.check("a.py", "x = 'é'\n").unwrap(), None);
            let err = checker.check("b.py", "def f(:\n").unwrap().unwrap();
            assert!(err.starts_with("line 1"), "{err}");
        }
    }
}
