//! Synthetic traces with known deficiencies, written in the agents' span format
//! (agents/CONTRACT.md), for tests and benchmarks until the corpus generator exists. Each
//! scenario plants one deficiency type's trace signature (from the catalog) into an otherwise
//! ordinary tool-calling run with some benign noise (a missing file, a slow search), and comes
//! with its ground-truth [`traces::Label`]. Deterministic: a seed picks ids and noise.

use serde_json::{json, Map, Value};
use traces::{Label, Span, SpanKind, StatusCode};

/// The deficiency types a scenario exists for, with the component the label names.
pub const SCENARIOS: &[(&str, &str)] = &[
    ("P2", "llm_client.stream"),
    ("P5", "context.window"),
    ("P9", "context.summarize"),
    ("P11", "llm_client.request"),
    ("P16", "tools.schema"),
    ("P18", "tools.validation"),
    ("P20", "concurrency.shared_state"),
    ("P24", "parsing.encoding"),
    ("P25", "parsing.json_extract"),
    ("C1", "orchestrator.termination"),
    ("C3", "orchestrator.reflection"),
    ("C6", "orchestrator.delegation"),
    ("C11", "prompt.system"),
    ("C12", "tools.registry"),
];

/// A trace under construction: spans in order, a clock, a step counter.
struct Builder {
    trace_id: String,
    root: String,
    spans: Vec<Span>,
    clock: i64,
    step: i64,
    rng: u64,
    agent: String,
}

impl Builder {
    fn new(trace_id: &str, seed: u64) -> Builder {
        let mut b = Builder {
            trace_id: trace_id.to_string(),
            root: String::new(),
            spans: Vec::new(),
            clock: 1_700_000_000_000_000_000 + (seed as i64 % 1000) * 1_000_000_000,
            step: 0,
            rng: seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407),
            agent: "assistant".to_string(),
        };
        let root = b.span(
            "agent.run",
            SpanKind::Agent,
            "toolcaller/agent.py",
            "Agent.run",
            0,
        );
        b.root = root;
        b
    }

    fn rand(&mut self, n: u64) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % n.max(1)
    }

    fn span(
        &mut self,
        name: &str,
        kind: SpanKind,
        file: &str,
        function: &str,
        duration_ms: i64,
    ) -> String {
        let span_id = format!("{:016x}", self.spans.len() as u64 + 1);
        let mut s = Span::new(&self.trace_id, &span_id, name, kind);
        s.parent_span_id = if self.spans.is_empty() {
            None
        } else {
            Some(self.root.clone())
        };
        s.start_time_ns = Some(self.clock);
        s.end_time_ns = Some(self.clock + duration_ms * 1_000_000);
        s.status = StatusCode::Ok;
        s.attributes = attrs(&[
            ("code.filepath", json!(file)),
            ("code.function", json!(function)),
            ("code.lineno", json!(10 + self.spans.len())),
            ("gen_ai.agent.name", json!(self.agent)),
            ("pathfinder.step_index", json!(self.step)),
        ]);
        s.code_filepath = Some(file.to_string());
        s.code_function = Some(function.to_string());
        s.agent_name = Some(self.agent.clone());
        s.step = Some(self.step);
        self.clock += duration_ms * 1_000_000 + 1_000_000;
        self.spans.push(s);
        span_id
    }

    fn last(&mut self) -> &mut Span {
        self.spans.last_mut().expect("a span was pushed")
    }

    fn llm(&mut self, input_tokens: i64, output: &str) {
        self.step += 1;
        let ms = 300 + self.rand(900) as i64;
        self.span(
            "llm.chat",
            SpanKind::Llm,
            "toolcaller/llm.py",
            "LLMClient.chat",
            ms,
        );
        let out_tokens = (output.len() as i64 / 4).max(1);
        let s = self.last();
        s.input_tokens = Some(input_tokens);
        s.output_tokens = Some(out_tokens);
        s.model = Some("pathfinder-scripted".into());
        s.output = Some(output.to_string());
        s.attributes
            .insert("gen_ai.operation.name".into(), json!("chat"));
        s.attributes
            .insert("gen_ai.request.model".into(), json!("pathfinder-scripted"));
        s.attributes
            .insert("gen_ai.usage.input_tokens".into(), json!(input_tokens));
        s.attributes
            .insert("gen_ai.usage.output_tokens".into(), json!(out_tokens));
        s.attributes.insert("output.value".into(), json!(output));
    }

    fn tool(&mut self, name: &str, args: &str, output: &str) {
        let ms = 20 + self.rand(200) as i64;
        self.span(
            &format!("tool.{name}"),
            SpanKind::Tool,
            "toolcaller/tools.py",
            &format!("tools.{name}"),
            ms,
        );
        let s = self.last();
        s.tool_name = Some(name.to_string());
        s.tool_arguments = Some(args.to_string());
        s.output = Some(output.to_string());
        s.attributes
            .insert("gen_ai.operation.name".into(), json!("execute_tool"));
        s.attributes.insert("gen_ai.tool.name".into(), json!(name));
        s.attributes
            .insert("gen_ai.tool.call.arguments".into(), json!(args));
        s.attributes.insert("output.value".into(), json!(output));
    }

    fn fail(&mut self, error_type: &str, message: &str) {
        let s = self.last();
        s.status = StatusCode::Error;
        s.status_message = Some(message.to_string());
        s.error_type = Some(error_type.to_string());
        s.error_message = Some(message.to_string());
        s.attributes.insert("error.type".into(), json!(error_type));
        s.attributes
            .insert("exception.message".into(), json!(message));
        s.attributes.insert(
            "exception.stacktrace".into(),
            json!(format!(
                "Traceback (most recent call last):\n  ...\n{error_type}: {message}"
            )),
        );
    }

    fn chain(&mut self, name: &str, function: &str) {
        self.span(name, SpanKind::Chain, "toolcaller/agent.py", function, 50);
    }

    /// Ordinary work: a search, a read, a reasoning step (and sometimes a benign miss).
    fn ordinary(&mut self, tokens: i64) {
        self.llm(
            tokens,
            "I will search the corpus for the population figure.",
        );
        let q = [
            "population of Lyon",
            "river length Rhone",
            "founding year of Turin",
        ][self.rand(3) as usize];
        self.tool(
            "search",
            &format!("{{\"query\": \"{q}\"}}"),
            "3 results: lyon.md, rhone.md, cities.csv",
        );
        if self.rand(3) == 0 {
            self.tool("read_file", "{\"path\": \"notes/missing.md\"}", "");
            self.fail(
                "FileNotFoundError",
                "No such file or directory: 'notes/missing.md'",
            );
        }
    }

    fn finish(mut self, outcome: &str, error: Option<(&str, &str)>) -> Vec<Span> {
        let end = self.clock;
        let max_step = self.step;
        let root = &mut self.spans[0];
        root.end_time_ns = Some(end);
        root.step = Some(0);
        root.attributes
            .insert("pathfinder.framework".into(), json!("toolcaller"));
        root.attributes
            .insert("pathfinder.task_id".into(), json!("gaia-001"));
        root.attributes
            .insert("pathfinder.outcome".into(), json!(outcome));
        root.attributes
            .insert("pathfinder.max_step".into(), json!(max_step));
        if let Some((t, m)) = error {
            root.status = StatusCode::Error;
            root.error_type = Some(t.into());
            root.error_message = Some(m.into());
            root.status_message = Some(m.into());
        }
        self.spans
    }
}

fn attrs(items: &[(&str, Value)]) -> Map<String, Value> {
    items
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// The spans and label of one scenario. `None` for an id without a scenario.
pub fn scenario(deficiency_id: &str, trace_id: &str, seed: u64) -> Option<(Vec<Span>, Label)> {
    let &(id, component) = SCENARIOS
        .iter()
        .find(|(id, _)| id.eq_ignore_ascii_case(deficiency_id))?;
    let mut b = Builder::new(trace_id, seed);
    let spans = match id {
        "P2" => {
            b.ordinary(900);
            for i in 0..3 {
                b.llm(1200 + i * 150, "I will write the summary file now.");
                let long = "x".repeat(180 + 40 * i as usize);
                b.tool(
                    "write_file",
                    &format!("{{\"path\": \"report.md\", \"content\": \"{long}"),
                    "",
                );
                b.fail(
                    "JSONDecodeError",
                    "Unterminated string starting at: line 1 column 31 (char 30)",
                );
            }
            b.finish("failed", None)
        }
        "P5" => {
            for i in 0..9 {
                b.ordinary(1_000 + i * 900);
            }
            b.llm(8_350, "");
            b.fail("BadRequestError", "This model's maximum context length is 8192 tokens; your messages resulted in 8350 tokens (context_length_exceeded)");
            b.finish(
                "crashed",
                Some(("BadRequestError", "context_length_exceeded")),
            )
        }
        "P9" => {
            b.ordinary(900);
            b.chain("context.summarize", "History.compress");
            for i in 0..4 {
                b.llm(
                    700 + i * 10,
                    "I need to look at the file again to see its contents.",
                );
                b.tool(
                    "read_file",
                    "{\"path\": \"corpus/cities.csv\"}",
                    "city,population\nLyon,522969\nTurin,848885",
                );
                b.chain("context.summarize", "History.compress");
            }
            b.finish("gave_up", None)
        }
        "P11" => {
            for _ in 0..3 {
                b.llm(400, "");
                let s = b.last();
                s.output_tokens = Some(0);
                s.end_time_ns = s.start_time_ns.map(|t| t + 40_000_000);
                b.fail(
                    "BadRequestError",
                    "temperature: 2.5 is not in the accepted range [0, 2]",
                );
            }
            b.finish(
                "crashed",
                Some(("BadRequestError", "temperature out of range")),
            )
        }
        "P16" => {
            b.chain("tools.load", "ToolRegistry.load");
            b.chain("schema.resolve", "SchemaResolver.resolve_ref");
            b.fail(
                "RecursionError",
                "maximum recursion depth exceeded while calling a Python object",
            );
            b.finish(
                "crashed",
                Some(("RecursionError", "maximum recursion depth exceeded")),
            )
        }
        "P18" => {
            b.ordinary(800);
            for unit in ["Celsius", "CELSIUS", "Celsius"] {
                b.llm(1000, "I will convert the temperature.");
                b.tool(
                    "convert",
                    &format!("{{\"value\": 21, \"unit\": \"{unit}\"}}"),
                    "",
                );
                b.fail(
                    "ValidationError",
                    &format!("'{unit}' is not one of ['celsius', 'fahrenheit']"),
                );
            }
            b.llm(1100, "I will convert the temperature.");
            b.tool("convert", "{\"value\": 21, \"unit\": \"celsius\"}", "69.8");
            b.finish("completed", None)
        }
        "P20" => {
            b.ordinary(800);
            b.agent = "researcher-0".into();
            b.span(
                "agent.research",
                SpanKind::Agent,
                "research/crew.py",
                "Crew.dispatch",
                500,
            );
            b.agent = "researcher-1".into();
            b.span(
                "agent.research",
                SpanKind::Agent,
                "research/crew.py",
                "Crew.dispatch",
                500,
            );
            b.agent = "assistant".into();
            b.chain("crew.on_result", "ResultHandler.on_result");
            b.fail("RuntimeError", "dictionary changed size during iteration");
            b.finish(
                "crashed",
                Some(("RuntimeError", "dictionary changed size during iteration")),
            )
        }
        "P24" => {
            b.ordinary(800);
            b.llm(1200, "I will read the data file.");
            b.tool("read_file", "{\"path\": \"corpus/table.bin\"}", "");
            b.fail(
                "UnicodeDecodeError",
                "'utf-8' codec can't decode byte 0x9c in position 17: invalid start byte",
            );
            b.finish(
                "crashed",
                Some(("UnicodeDecodeError", "'utf-8' codec can't decode byte 0x9c")),
            )
        }
        "P25" => {
            b.ordinary(800);
            for i in 0..3 {
                b.llm(
                    1000 + i * 120,
                    "```json\n{\"tool\": \"search\", \"arguments\": {\"query\": \"Lyon\"}}\n```",
                );
                b.chain("parse.tool_call", "extract_json");
                b.fail(
                    "JSONDecodeError",
                    "Expecting value: line 1 column 1 (char 0)",
                );
            }
            b.finish("failed", None)
        }
        "C1" => {
            for _ in 0..8 {
                b.llm(1500, "Draft: Lyon has about 520,000 inhabitants.");
                b.chain("critique", "Reflector.critique");
                b.llm(1500, "Critique: the draft could be more precise. Revise.");
            }
            b.finish(
                "failed",
                Some(("StepLimitReached", "step cap of 16 reached")),
            )
        }
        "C3" => {
            b.ordinary(800);
            for i in 0..5 {
                b.llm(1000 + i * 50, "I will open the notes file.");
                b.tool("read_file", "{\"path\": \"notes/today.md\"}", "");
                b.fail(
                    "FileNotFoundError",
                    "No such file or directory: 'notes/today.md'",
                );
            }
            b.llm(1400, "The answer is 42.");
            b.finish("completed", None)
        }
        "C6" => {
            for i in 0..8 {
                b.agent = if i % 2 == 0 {
                    "planner".into()
                } else {
                    "researcher".into()
                };
                b.span(
                    "agent.handoff",
                    SpanKind::Agent,
                    "roleplay/agents.py",
                    "Agent.delegate",
                    100,
                );
                b.llm(
                    900,
                    "Passing this task to my colleague, who is better placed to handle it.",
                );
            }
            b.finish(
                "failed",
                Some(("RecursionLimit", "delegation depth limit reached")),
            )
        }
        "C11" => {
            b.llm(3_200, "I am not allowed to access files without explicit permission, so I cannot read the corpus.");
            b.llm(3_300, "Searching would violate the rule to never guess; I am not allowed to search either.");
            b.llm(
                3_350,
                "I cannot answer this question under the rules I was given.",
            );
            b.finish("gave_up", None)
        }
        "C12" => {
            b.llm(900, "I will read the table one line at a time.");
            for line in 1..=14 {
                b.tool(
                    "read_line",
                    &format!("{{\"path\": \"corpus/cities.csv\", \"line\": {line}}}"),
                    "Lyon,522969",
                );
            }
            b.llm(2600, "The population of Lyon is 522969.");
            b.finish("completed", None)
        }
        _ => return None,
    };
    let mut label = Label::new(trace_id);
    label.truth.deficiency_id = Some(id.to_string());
    label.truth.component = Some(component.to_string());
    label.reason = Some("synthetic scenario (detect::synthetic)".into());
    Some((spans, label))
}

/// A long ordinary trace of about `spans` spans (for benchmarks), with scattered errors.
pub fn large_trace(trace_id: &str, spans: usize, seed: u64) -> Vec<Span> {
    let mut b = Builder::new(trace_id, seed);
    let mut tokens = 800;
    while b.spans.len() + 3 < spans {
        b.ordinary(tokens);
        tokens = 800 + (tokens + 37) % 6000;
    }
    b.finish("completed", None)
}

/// Builds a store file with one trace per scenario (`repeats` seeds each) and their labels.
/// Returns (trace id, label) pairs.
pub fn build_store(path: &std::path::Path, repeats: u64) -> traces::Result<Vec<(String, Label)>> {
    let mut store = traces::Store::open(path)?;
    let mut out = Vec::new();
    for (i, (id, _)) in SCENARIOS.iter().enumerate() {
        for r in 0..repeats {
            let trace_id = format!("{:016x}{:016x}", i as u64 + 1, r + 1);
            let (spans, label) =
                scenario(id, &trace_id, 17 * r + i as u64).expect("listed scenario");
            store.import_spans(spans, &format!("synthetic:{id}"))?;
            store.put_label(&label)?;
            out.push((trace_id, label));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_names_a_catalog_type_and_component() {
        let catalog = taxonomy::Catalog::embedded().unwrap();
        for (id, component) in SCENARIOS {
            let d = catalog.get(id).unwrap();
            assert!(
                d.components.iter().any(|c| c == component),
                "{id} {component}"
            );
            let (spans, label) = scenario(id, "t", 1).unwrap();
            assert!(spans.len() >= 3, "{id}");
            assert_eq!(label.truth.deficiency_id.as_deref(), Some(*id));
        }
    }
}
