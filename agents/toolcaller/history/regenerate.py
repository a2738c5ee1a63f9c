"""Regenerates history/*.patch and series.toml from toolcaller's final code.

Run from the repository root after changing code that a fix touches:
    python3 agents/toolcaller/history/regenerate.py agents/toolcaller
Each fix lists (file, text in the final code, text before the fix); states are built backwards
from the final tree and each patch is the diff between consecutive states, so the series always
describes the code as it is. `pathfinder agents validate` checks that it replays."""
import difflib, os, sys

AGENT = sys.argv[1]
FIXES = [
 dict(patch="0001-validate-tool-arguments.patch",
      message="Validate tool arguments against the schema before execution\n\nArguments were passed to the tool as the model wrote them, so a wrong type or a\nmissing field surfaced as a TypeError deep inside the tool. Validate first and\nreport every violation to the model; apply schema defaults on the way.",
      author="Ada Developer <ada@example.org>", date="2026-02-03T10:12:00Z", component="tools.validation",
      edits=[
        ("toolcaller/tools/base.py", "from .. import schema as jsonschema\n", ""),
        ("toolcaller/tools/base.py", '''def validate_arguments(tool: Tool, args: dict[str, Any]) -> dict[str, Any]:
    """The arguments with defaults applied; raises ToolError listing every violation."""
    errors = jsonschema.validate(args, tool.parameters)
    if errors:
        raise ToolError("invalid arguments for {}: {}".format(tool.name, "; ".join(errors)))
    return jsonschema.apply_defaults(args, tool.parameters)


''', ""),
        ("toolcaller/tools/base.py", "                args = validate_arguments(tool, args)\n", ""),
      ]),
 dict(patch="0002-retry-transient-llm-errors.patch",
      message="Retry model calls on transport errors, 429 and 5xx with backoff\n\nA single 502 from the gateway ended the whole run. Retry transient failures with\nexponential backoff and jitter; client errors still fail at once.",
      author="Ben Okoro <ben@example.org>", date="2026-02-11T15:40:00Z", component="llm_client.retry",
      edits=[
        ("toolcaller/llm.py", "import random\n", ""),
        ("toolcaller/llm.py", "import time\n", ""),
        ("toolcaller/llm.py", '''# --------------------------------------------------------------------------- retries

@dataclass
class RetryPolicy:
    """Exponential backoff with jitter for transient failures."""

    attempts: int = 4
    base_delay: float = 0.2
    max_delay: float = 4.0

    @staticmethod
    def retryable(error: LLMError) -> bool:
        """Transport errors, rate limits and server errors are transient; other 4xx are not."""
        return error.status == 0 or error.status == 429 or error.status >= 500

    def delay(self, attempt: int, rng: random.Random) -> float:
        return min(self.max_delay, self.base_delay * (2 ** attempt)) * (0.5 + rng.random() / 2)


''', ""),
        ("toolcaller/llm.py", '''                 usage: tokens.UsageMeter, retry: RetryPolicy | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:''', '''                 usage: tokens.UsageMeter) -> None:'''),
        ("toolcaller/llm.py", '''        self.usage = usage
        self.retry = retry or RetryPolicy()
        self.sleep = sleep
        self._rng = random.Random(seed)
''', '''        self.usage = usage
'''),
        ("toolcaller/llm.py", '''        """One completion, retried on transient failures; recorded as an `llm.chat` span."""''',
                              '''        """One completion, recorded as an `llm.chat` span."""'''),
        ("toolcaller/llm.py", '''            attempt = 0
            while True:
                try:
                    result = self._send(body, conversation, on_delta)
                    break
                except LLMError as error:
                    if not self.retry.retryable(error) or attempt + 1 >= self.retry.attempts:
                        span.set("pathfinder.llm.attempts", attempt + 1)
                        raise
                    delay = self.retry.delay(attempt, self._rng)
                    with self.tracer.span("llm.retry", kind="other", attributes={
                        "pathfinder.retry.attempt": attempt + 1,
                        "pathfinder.retry.delay_s": round(delay, 3),
                        "error.type": type(error).__name__,
                        "http.response.status_code": error.status,
                        "exception.message": str(error),
                    }):
                        self.sleep(delay)
                    attempt += 1
''', '''            attempt = 0
            result = self._send(body, conversation, on_delta)
'''),
      ]),
 dict(patch="0003-decode-corpus-with-replacement.patch",
      message="Decode corpus files with errors='replace'\n\nOne Latin-1 file in a customer's corpus made read_file and search raise\nUnicodeDecodeError for every query. Undecodable bytes now become U+FFFD.",
      author="Ada Developer <ada@example.org>", date="2026-02-19T09:05:00Z", component="parsing.encoding",
      edits=[
        ("toolcaller/tools/corpus.py", '''    """A corpus file as text. Bytes that are not UTF-8 become U+FFFD rather than failing."""
    return path.read_bytes().decode("utf-8", errors="replace")''', '''    """A corpus file as text."""
    return path.read_text(encoding="utf-8")'''),
      ]),
 dict(patch="0004-decode-sse-bytes-incrementally.patch",
      message="Decode the event stream incrementally\n\nEach read was decoded on its own, so a multi-byte character split between two\nreads raised UnicodeDecodeError mid-stream (seen with long answers in Greek).\nUse an incremental UTF-8 decoder that carries partial sequences over.",
      author="Chen Li <chen@example.org>", date="2026-03-04T17:22:00Z", component="llm_client.stream",
      edits=[
        ("toolcaller/llm.py", "import codecs\n", ""),
        ("toolcaller/llm.py", '''    """Bytes of a `text/event-stream` in, the `data` of each event out.

    Bytes are decoded incrementally so that a multi-byte character split across two reads
    is decoded whole; undecodable bytes become U+FFFD instead of failing the stream.
    """''', '''    """Bytes of a `text/event-stream` in, the `data` of each event out."""'''),
        ("toolcaller/llm.py", '''        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
''', ""),
        ("toolcaller/llm.py", "        self._buffer += self._decoder.decode(chunk)\n", '        self._buffer += chunk.decode("utf-8")\n'),
        ("toolcaller/llm.py", '''        self._buffer += self._decoder.decode(b"", final=True)
''', ""),
      ]),
 dict(patch="0005-check-context-window-before-calls.patch",
      message="Fit the prompt into the context window before every model call\n\nLong read_file results pushed later prompts past the window and the provider\nanswered 400 context_length_exceeded. Summarise, then elide, old tool results\nwhen the prompt would not fit with the completion reserve.",
      author="Ben Okoro <ben@example.org>", date="2026-03-12T11:48:00Z", component="context.window",
      edits=[
        ("toolcaller/agent.py", "                self.fit_context(convo, tools)\n", ""),
        ("toolcaller/agent.py", '''    def fit_context(self, convo: Conversation, tools: list[dict[str, Any]]) -> None:
        """Summarises or drops old turns when the prompt would not fit the window."""
        if self.window.fits(convo.messages, tools):
            return
        with self.tracer.span("context.fit", kind="other", code=ContextWindow.fit) as span:
            fitted, report = self.window.fit(convo.messages, tools, summarize_text)
            for key, value in report.items():
                span.set(f"pathfinder.context.{key}", value)
            convo.replace(fitted)

''', ""),
      ]),
]

def read(rel): 
    with open(os.path.join(AGENT, rel), encoding="utf-8") as f: return f.read()

state = {}
def get(rel):
    if rel not in state: state[rel] = read(rel)
    return state[rel]

# Walk backwards: state after fix k -> state before fix k.
patches = {}
for fix in reversed(FIXES):
    before = {}
    for rel, final_text, prior_text in fix["edits"]:
        cur = before.get(rel, get(rel))
        n = cur.count(final_text)
        if n != 1:
            sys.exit(f"{fix['patch']}: {rel}: snippet found {n} times:\n{final_text[:200]}")
        before[rel] = cur.replace(final_text, prior_text, 1)
    diff = []
    for rel in sorted(before):
        after_text, before_text = get(rel), before[rel]
        lines = list(difflib.unified_diff(before_text.splitlines(keepends=True), after_text.splitlines(keepends=True), f"a/{rel}", f"b/{rel}", n=3))
        if not lines: continue
        diff.append(f"diff --git a/{rel} b/{rel}\n")
        for l in lines:
            if l.startswith("---") or l.startswith("+++"):
                l = l.rstrip() + "\n"  # difflib adds no dates when none given
            diff.append(l if l.endswith("\n") else l + "\n\\ No newline at end of file\n")
        state[rel] = before_text
    patches[fix["patch"]] = "".join(diff)

hist = os.path.join(AGENT, "history")
for name in os.listdir(hist):
    if name.endswith(".patch"): os.remove(os.path.join(hist, name))
for name, text in patches.items():
    with open(os.path.join(hist, name), "w", encoding="utf-8") as f: f.write(text)
def q(s): return '"' + s.replace('\\', '\\\\').replace('"', '\\"') + '"'
with open(os.path.join(hist, "series.toml"), "w", encoding="utf-8") as f:
    f.write("# The fix commits through which toolcaller's defensive code arrived, oldest first.\n")
    f.write("# Materialisation reverse-applies them from the final tree to get the initial import.\n")
    for fix in FIXES:
        f.write("\n[[commit]]\n")
        f.write(f"patch = {q(fix['patch'])}\n")
        msg = fix["message"].replace('"""', '')
        f.write(f'message = """{msg}"""\n')
        for k in ("author", "date", "component"):
            f.write(f"{k} = {q(fix[k])}\n")
print("wrote", len(patches), "patches")
