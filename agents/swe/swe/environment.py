"""The work repository and the command handlers of the agent-computer interface.

The environment keeps the editor state (open file, current line), snapshots the repository
when the run starts so a submission is a unified diff against that snapshot, and makes
every observation independent of where the work directory lives (paths are shown relative
to the repository root, test timings are dropped), so identical states read identically.
"""

from __future__ import annotations

import ast
import difflib
import fnmatch
import os
import re
import shlex
import subprocess
from pathlib import Path

from .config import AgentConfig

SKIP_DIRS = {".git", "__pycache__", ".mypy_cache", ".pytest_cache"}
_TEST_TIMING = re.compile(r"^(Ran \d+ tests?) in \d+(?:\.\d+)?s$", re.MULTILINE)


class ToolError(Exception):
    """A command failed in a way the model should read about and correct."""


class LintError(ToolError):
    """An edit would have left a Python file unparseable; it was rolled back."""


def list_files(root: Path, start: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(start):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            found.append(Path(dirpath, name))
    return found


def read_text(path: Path) -> str | None:
    """File contents as text, or None for binary files."""
    data = path.read_bytes()
    if b"\x00" in data[:4096]:
        return None
    return data.decode("utf-8", errors="replace")


class SWEEnvironment:
    def __init__(self, repo: Path, test_command: str, config: AgentConfig) -> None:
        self.repo = repo.resolve()
        self.test_command = test_command
        self.config = config
        self.open_path: str | None = None
        self.current_line = 1
        self.pending_submission: str | None = None
        self._snapshot = self._take_snapshot()

    # ----- repository state -------------------------------------------------------------

    def _take_snapshot(self) -> dict[str, bytes]:
        return {self.rel(p): p.read_bytes() for p in list_files(self.repo, self.repo)}

    def rel(self, path: Path) -> str:
        return path.resolve().relative_to(self.repo).as_posix()

    def resolve(self, path: str) -> Path:
        """A path inside the repository; anything outside it is refused."""
        candidate = (self.repo / path).resolve()
        if candidate != self.repo and self.repo not in candidate.parents:
            raise ToolError(f"{path}: outside the repository")
        return candidate

    def diff(self) -> str:
        """Unified diff of the repository against the snapshot taken at start."""
        current = {self.rel(p): p.read_bytes() for p in list_files(self.repo, self.repo)}
        chunks: list[str] = []
        for name in sorted(set(self._snapshot) | set(current)):
            before, after = self._snapshot.get(name), current.get(name)
            if before == after:
                continue
            old = before.decode("utf-8", errors="replace").splitlines(keepends=True) if before is not None else []
            new = after.decode("utf-8", errors="replace").splitlines(keepends=True) if after is not None else []
            header = f"diff --git a/{name} b/{name}\n"
            lines = list(
                difflib.unified_diff(
                    old,
                    new,
                    fromfile=f"a/{name}" if before is not None else "/dev/null",
                    tofile=f"b/{name}" if after is not None else "/dev/null",
                )
            )
            fixed = [line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines]
            chunks.append(header + "".join(fixed))
        return "".join(chunks)

    def state_line(self) -> str:
        open_file = self.open_path or "n/a"
        return f"(Open file: {open_file}) (Current directory: /repo)"

    # ----- viewer ------------------------------------------------------------------------

    def _lines(self, rel: str) -> list[str]:
        text = read_text(self.resolve(rel))
        if text is None:
            raise ToolError(f"{rel}: binary file; cannot display it")
        return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")

    def _window(self) -> str:
        assert self.open_path is not None
        lines = self._lines(self.open_path)
        total = len(lines)
        size = self.config.window_lines
        start = max(1, self.current_line - size // 2)
        end = min(total, start + size - 1)
        start = max(1, min(start, end - size + 1))
        out = [f"[File: {self.open_path} ({total} lines total)]", f"({start - 1} more lines above)"]
        for number in range(start, end + 1):
            out.append(f"{number}:{lines[number - 1]}")
        out.append(f"({max(0, total - end)} more lines below)")
        return "\n".join(out)

    def _require_open(self) -> list[str]:
        if self.open_path is None:
            raise ToolError("no file is open; use open <path> first")
        return self._lines(self.open_path)

    def open_file(self, path: str, line_number: int | None = None) -> str:
        target = self.resolve(path)
        if not target.exists():
            raise ToolError(f"File {path} not found")
        if target.is_dir():
            raise ToolError(f"{path} is a directory; use find_file or search_dir")
        self.open_path = self.rel(target)
        total = len(self._lines(self.open_path))
        if line_number is not None and line_number > max(total, 1):
            raise ToolError(f"line {line_number} is past the end of {path} ({total} lines)")
        self.current_line = line_number if line_number is not None else self.config.window_lines // 2
        return self._window()

    def goto(self, line_number: int) -> str:
        lines = self._require_open()
        if line_number > len(lines):
            raise ToolError(f"line {line_number} is past the end of the file ({len(lines)} lines)")
        self.current_line = line_number
        return self._window()

    def scroll_down(self) -> str:
        lines = self._require_open()
        step = self.config.window_lines - self.config.scroll_overlap
        self.current_line = min(len(lines), self.current_line + step)
        return self._window()

    def scroll_up(self) -> str:
        self._require_open()
        step = self.config.window_lines - self.config.scroll_overlap
        self.current_line = max(1, self.current_line - step)
        return self._window()

    # ----- search ------------------------------------------------------------------------

    def search_dir(self, search_term: str, dir: str = ".") -> str:
        base = self.resolve(dir)
        if not base.is_dir():
            raise ToolError(f"Directory {dir} not found")
        counts: list[tuple[str, int]] = []
        for path in list_files(self.repo, base):
            text = read_text(path)
            if text is None:
                continue
            hits = text.count(search_term)
            if hits:
                counts.append((self.rel(path), hits))
        where = self.rel(base) if base != self.repo else "."
        if not counts:
            return f'No matches found for "{search_term}" in {where}'
        if len(counts) > self.config.search_result_limit:
            return (
                f'More than {self.config.search_result_limit} files matched for "{search_term}" '
                f"in {where}. Please narrow your search."
            )
        total = sum(n for _, n in counts)
        body = "\n".join(f"{name} ({n} matches)" for name, n in counts)
        return (
            f'Found {total} matches for "{search_term}" in {where}:\n{body}\n'
            f'End of matches for "{search_term}" in {where}'
        )

    def search_file(self, search_term: str, file: str | None = None) -> str:
        rel = file if file is not None else self.open_path
        if rel is None:
            raise ToolError("no file is open and no file was given")
        target = self.resolve(rel)
        if not target.is_file():
            raise ToolError(f"File {rel} not found")
        rel = self.rel(target)
        hits = [(i, line) for i, line in enumerate(self._lines(rel), start=1) if search_term in line]
        if not hits:
            return f'No matches found for "{search_term}" in {rel}'
        if len(hits) > self.config.search_result_limit:
            return f'More than {self.config.search_result_limit} lines matched for "{search_term}" in {rel}. Please narrow your search.'
        body = "\n".join(f"Line {i}:{line}" for i, line in hits)
        return (
            f'Found {len(hits)} matches for "{search_term}" in {rel}:\n{body}\n'
            f'End of matches for "{search_term}" in {rel}'
        )

    def find_file(self, file_name: str, dir: str = ".") -> str:
        base = self.resolve(dir)
        if not base.is_dir():
            raise ToolError(f"Directory {dir} not found")
        matches = [self.rel(p) for p in list_files(self.repo, base) if fnmatch.fnmatch(p.name, file_name)]
        where = self.rel(base) if base != self.repo else "."
        if not matches:
            return f'No matches found for "{file_name}" in {where}'
        body = "\n".join(matches)
        return f'Found {len(matches)} matches for "{file_name}" in {where}:\n{body}'

    # ----- editor ------------------------------------------------------------------------

    def edit(self, start_line: int, end_line: int, replacement_text: str) -> str:
        lines = self._require_open()
        assert self.open_path is not None
        if start_line > len(lines) + 1:
            raise ToolError(f"start_line {start_line} is past the end of the file ({len(lines)} lines)")
        if end_line < start_line - 1 or end_line > len(lines):
            raise ToolError(
                f"invalid range {start_line}:{end_line} for a file of {len(lines)} lines "
                "(end_line must be between start_line - 1 and the last line)"
            )
        target = self.resolve(self.open_path)
        original = target.read_bytes()
        if replacement_text.endswith("\n"):
            replacement_text = replacement_text[:-1]
        new_lines = replacement_text.split("\n") if replacement_text else []
        updated = lines[: start_line - 1] + new_lines + lines[end_line:]
        text = "\n".join(updated) + ("\n" if updated else "")
        target.write_text(text, encoding="utf-8")
        if target.suffix == ".py":
            self._lint_or_rollback(target, original, text, start_line, len(new_lines))
        self.current_line = start_line
        return (
            f"{self._window()}\nFile updated. Please review the changes and make sure they are "
            "correct (correct indentation, no duplicate lines, etc). Edit the file again if necessary."
        )

    def _lint_or_rollback(self, target: Path, original: bytes, text: str, start: int, count: int) -> None:
        """Refuse edits that turn a parseable Python file into an unparseable one."""
        try:
            ast.parse(original.decode("utf-8", errors="replace"))
        except SyntaxError:
            return  # already broken before this edit; the edit may be the repair
        try:
            ast.parse(text)
        except SyntaxError as exc:
            target.write_bytes(original)
            proposed = text.split("\n")
            lo, hi = max(1, start - 3), min(len(proposed), start + count + 2)
            shown = "\n".join(f"{n}:{proposed[n - 1]}" for n in range(lo, hi + 1))
            raise LintError(
                "Your proposed edit has introduced new syntax error(s). Please read this error "
                "message carefully and then retry editing the file.\n\n"
                f"ERRORS:\n- line {exc.lineno}: {exc.msg}\n\n"
                f"This is how your edit would have looked if applied\n-------------------------------------------------\n"
                f"{shown}\n-------------------------------------------------\n"
                "Your changes have NOT been applied. Please fix your edit command and try again.\n"
                "DO NOT re-run the same failed edit command. Running it again will lead to the same error."
            ) from None

    def create(self, filename: str) -> str:
        target = self.resolve(filename)
        if target.exists():
            raise ToolError(f"File {filename} already exists")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("", encoding="utf-8")
        self.open_path = self.rel(target)
        self.current_line = 1
        return f"[File: {self.open_path} (0 lines total)]\n(0 more lines above)\n(0 more lines below)"

    # ----- tests and submission ----------------------------------------------------------

    def test_argv(self, test_ids: list[str] | None, verbosity: str) -> list[str]:
        argv = shlex.split(self.test_command)
        is_unittest = argv[1:3] == ["-m", "unittest"]
        if is_unittest:
            flags = {"quiet": ["-q"], "normal": [], "verbose": ["-v"]}[verbosity]
            argv = argv[:3] + flags + [a for a in argv[3:] if a not in ("-q", "-v")]
        if test_ids:
            if not is_unittest:
                raise ToolError("test ids can only be given when the test command runs unittest")
            argv = argv + list(test_ids)
        return argv

    def run_tests(self, test_ids: list[str] | None = None, verbosity: str = "quiet") -> str:
        argv = self.test_argv(test_ids, verbosity)
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0", PYTHONIOENCODING="utf-8")
        try:
            proc = subprocess.run(
                argv,
                cwd=self.repo,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=self.config.test_timeout_s,
                env=env,
            )
        except subprocess.TimeoutExpired:
            raise ToolError(f"the tests did not finish within {self.config.test_timeout_s:g} seconds") from None
        except FileNotFoundError as exc:
            raise ToolError(f"cannot run the test command: {exc.strerror}: {argv[0]}") from None
        output = proc.stdout.decode("utf-8", errors="replace")
        output = output.replace(str(self.repo) + os.sep, "")
        output = _TEST_TIMING.sub(r"\1", output)
        status = "passed" if proc.returncode == 0 else f"failed (exit status {proc.returncode})"
        return f"$ {' '.join(argv)}\n{output.rstrip()}\n[tests {status}]"

    def submit(self) -> str:
        self.pending_submission = self.diff()
        return self.pending_submission or "(no changes)"
