//! How the scripted model departs from its script when a request lacks what a real model
//! needs to follow it.
//!
//! A script is the solution path a capable model takes when the agent gives it what it needs.
//! An injected design flaw changes what the agent sends — a tool without a description, a
//! table without its header, a fact compressed out of the history, a system prompt that piles
//! on prohibitions or tells the model to answer from memory — and a real model then does
//! something else. The scripted backend reads each request for those features and departs the
//! way a model plausibly would, deterministically given the request:
//!
//! | The request…                                         | The model…                          |
//! |------------------------------------------------------|-------------------------------------|
//! | lacks a fact (number, file name, accented name) that the step uses | calls the tool that should have given it again ([`Departure::Recheck`]), then answers `unknown` ([`Departure::GiveUp`]) |
//! | shows a table's rows without a header                 | reads a value from the wrong column ([`Departure::Misread`]) |
//! | offers a tool whose description says nothing beyond its name | guesses its arguments on first use ([`Departure::GuessedArguments`]) |
//! | tells it to answer from what it knows / keep tools to a minimum | answers at once, from memory ([`Departure::FromMemory`]) |
//! | piles six or more prohibitions into the system prompt | refuses ([`Departure::Refusal`])    |
//! | has no system message, or gives it two identities     | asks which role it has ([`Departure::RoleConfusion`]) |
//! | asks for one fact or one call at a time               | makes one call with one condition ([`Departure::OneAtATime`]) |
//! | shows a name only in another Unicode form             | copies that form ([`Departure::CopiedSpelling`]) |
//! | asks for a JSON reply without showing its keys (no example, no schema) | names the keys itself ([`Departure::InventedKeys`]) |
//! | forbids a command or tool the step uses ("never run the tests yourself")   | leaves that step out ([`Departure::Obeys`]) |
//! | answers with a message that forbids the step ("do not submit yourself: hand the change back") | takes a later step the message allows, or hands the step back in words ([`Departure::Obeys`]) |
//! | offers tools to a role whose script never calls one (an instructor, a planner) | does its own first instruction with a tool ([`Departure::DoesItself`]) |
//! | never says what a finished result is (no "when you know the answer", "once the tests pass") | declares the work done after its first result ([`Departure::StopsEarly`]) |
//! | sends its task again word for word after it worked on it (a loop that hands the task back instead of answering the reply) | starts the work over from its first step ([`Departure::StartsOver`]) |
//!
//! Why a real model does this: TRAIL counts formatting errors and instruction non-compliance
//! as 353 of the 841 errors it annotates in agent traces (42%), and lists tool-selection
//! errors and hallucinated or ungrounded facts (invented tool outputs, misunderstood tool
//! functions) among the rest; TRAJECT-Bench scores tool selection and argument correctness
//! apart from the final answer because a wrong answer so often starts there. A model cannot
//! copy a fact that is no longer in its context, and told to rely on its own knowledge it
//! states a plausible value instead of looking it up. AgentErrorBench finds memory and
//! reflection errors — an agent misjudging its own progress among them — the commonest
//! sources of cascading failures: without a stated criterion for done, the first plausible
//! result looks like the end. And a
//! model given a rule that contradicts the rest of its instructions follows one of them; a
//! prohibition, being the more specific, usually wins (TRAIL's instruction non-compliance).
//! A chat model keeps no state between requests but its prompt: handed the same task again
//! after an answer it was not told was wrong, it reads the task as the request to answer and
//! does the work again: the repeated cycles of action AgentErrorBench traces to an agent that
//! misjudges its own progress.
//!
//! Clean runs never depart: every fact a script uses is in the prompt a clean agent sends (or
//! listed in the step's `computed`, for sums and names the model works out), and the clean
//! prompts carry at most five prohibitions, one identity and described tools. The
//! `clean_scripts_play_as_written` test in `crates/agents` and `agents suite` with
//! `PATHFINDER_LOG=llmserve=debug` check that.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::api::ChatRequest;
use crate::script::{ScriptedCall, Step};

/// What the scripted model did with a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// Played as written.
    Scripted,
    /// A fact the step uses is not in the prompt: the previous step's tool calls again.
    Recheck,
    /// A fact the answer uses is still not in the prompt after a recheck: it is answered as
    /// `unknown`.
    GiveUp,
    /// A value copied from a header-less table was taken from a neighbouring column.
    Misread,
    /// A tool with no description was called with guessed arguments.
    GuessedArguments,
    /// A name the prompt spells in another Unicode form was copied in that form.
    CopiedSpelling,
    /// Told to look up one thing per call, the model made one call with one condition where
    /// the script combines several.
    OneAtATime,
    /// Told to answer from what it knows, the model answered at once with remembered
    /// (wrong) values.
    FromMemory,
    /// Too many prohibitions: the model declined.
    Refusal,
    /// No system role or two identities: the model asked which role it has.
    RoleConfusion,
    /// A JSON reply whose key names the request never shows was written with keys of the
    /// model's own naming.
    InventedKeys,
    /// Told to reply when it is "done" but never what done is, the model declared the work
    /// finished after its first result and skipped the rest of the script (the checks among
    /// it), answering with what it had.
    StopsEarly,
    /// The system prompt, or the message the model answers, forbids a command or tool the
    /// step uses (a rule that contradicts the rest of the instructions): the model obeyed it
    /// and went on to the next step; told so in the message it answers, with no later step
    /// allowed, it handed the step back in words.
    Obeys,
    /// A role whose script never calls a tool (one that instructs, plans or reviews) was
    /// offered tools anyway: it did its own instruction with one of them first.
    DoesItself,
    /// The conversation's task was sent again after the model had worked on it (a loop that
    /// hands the task back instead of answering the reply): the model started its work over,
    /// from its first step.
    StartsOver,
}

impl Departure {
    pub fn as_str(self) -> &'static str {
        match self {
            Departure::Scripted => "scripted",
            Departure::Recheck => "recheck",
            Departure::GiveUp => "give_up",
            Departure::Misread => "misread",
            Departure::GuessedArguments => "guessed_arguments",
            Departure::CopiedSpelling => "copied_spelling",
            Departure::OneAtATime => "one_at_a_time",
            Departure::FromMemory => "from_memory",
            Departure::Refusal => "refusal",
            Departure::RoleConfusion => "role_confusion",
            Departure::InventedKeys => "invented_keys",
            Departure::StopsEarly => "stops_early",
            Departure::Obeys => "obeys",
            Departure::DoesItself => "does_itself",
            Departure::StartsOver => "starts_over",
        }
    }
}

/// Prohibitions in the system prompt at which the model refuses. The clean agents' system
/// prompts hold at most 5 (measured with `PATHFINDER_LOG=llmserve=trace pathfinder agents
/// suite`, which logs what each conversation's first request holds).
pub const REFUSAL_RULES: usize = 6;

/// Turns past the script's end the model spends rechecking before it gives up.
pub const RECHECKS: usize = 1;

/// The step the scripted model plays, how it departed from its script, and why (for logs).
#[derive(Debug, Clone, PartialEq)]
pub struct Played {
    pub step: Step,
    pub departure: Departure,
    pub why: String,
}

impl Played {
    fn new(step: Step, departure: Departure, why: impl Into<String>) -> Played {
        Played {
            step,
            departure,
            why: why.into(),
        }
    }
}

/// What the scripted model plays at `turn` of a conversation whose script is `steps`
/// (non-empty).
pub fn play(steps: &[Step], turn: usize, request: &ChatRequest) -> Played {
    // Handed its task again word for word after working on it, a model reads it as a fresh
    // request and starts over: the script plays from its first step as of the repeat. The
    // first request's reactions (refusal, role confusion, ...) were judged when the task came
    // first and are not judged again.
    if let Some(since) = request.turns_since_task_repeated() {
        let mut played = play_turn(steps, since, request, false);
        if played.departure == Departure::Scripted {
            played.departure = Departure::StartsOver;
            played.why = format!(
                "the task was sent again; turn {turn} plays step {} of the script",
                since.min(steps.len() - 1)
            );
        }
        return played;
    }
    play_turn(steps, turn, request, true)
}

/// One turn of the script: `first_request` says whether turn 0 is the conversation's first
/// request, where the system prompt's reactions are judged.
fn play_turn(steps: &[Step], turn: usize, request: &ChatRequest, first_request: bool) -> Played {
    let n = turn.min(steps.len() - 1);
    let step = steps[n].react(|| request.last_observation()).clone();
    let reading = Reading::of(request);
    let uses_tools = steps.iter().any(|s| !s.tool_calls.is_empty());
    tracing::trace!(turn, chars = reading.text.len(), "prompt size");
    if turn == 0 && first_request {
        let rules = reading.prohibitions();
        tracing::trace!(
            prohibitions = rules.len(),
            identities = ?identities(&reading.system),
            undescribed = ?reading.undescribed,
            system = !reading.system.is_empty(),
            "what the scripted model reads in a conversation's first request"
        );
        if uses_tools && reading.told_to_answer_from_memory() {
            let last = steps[steps.len() - 1].react(|| None);
            if let Some(content) = &last.content {
                return Played::new(
                    text_step(reading.answer_from_memory(content)),
                    Departure::FromMemory,
                    "the system prompt says to answer from memory or keep tool use minimal",
                );
            }
        }
        if rules.len() >= REFUSAL_RULES {
            return Played::new(
                text_step(format!(
                    "I cannot do this task within the rules I was given: {} and {} leave no way to find and check the facts.",
                    rules[0], rules[1]
                )),
                Departure::Refusal,
                format!("{} prohibitions in the system prompt", rules.len()),
            );
        }
        if let Some(question) = reading.role_confusion() {
            return Played::new(
                text_step(question),
                Departure::RoleConfusion,
                "no system message, or two identities",
            );
        }
        // A command-line agent's script names its commands in text, not as tool calls.
        if steps.iter().all(|s| s.commands().is_empty()) {
            if let Some(call) = reading.own_tool_call(&step) {
                let why = format!(
                    "offered {} tools its script never calls; it runs {} itself",
                    reading.offered.len(),
                    call.name
                );
                let step = Step {
                    content: None,
                    tool_calls: vec![call],
                    ..text_step(String::new())
                };
                return Played::new(step, Departure::DoesItself, why);
            }
        }
    }
    let last = steps.len() - 1;
    if let Some(rule) = reading.answer_forbids(&step) {
        // Told in the message it answers not to take this step (a reviewer's "do not submit
        // yourself: hand it back"): the model takes the first later step the message allows,
        // and with none it hands the step back in words, running nothing.
        let allowed = (n + 1..=last)
            .map(|k| steps[k].react(|| request.last_observation()).clone())
            .find(|s| reading.answer_forbids(s).is_none());
        let step = allowed.unwrap_or_else(|| {
            text_step(format!(
                "Understood, I will not run {} myself. I am handing it back: {rule}",
                step.commands().join(", ")
            ))
        });
        return Played::new(
            step,
            Departure::Obeys,
            format!("the message it answers says: {rule}"),
        );
    }
    if let Some(rule) = reading.forbids(&step) {
        // The first later step that the rule allows; with none, the step plays on below.
        let allowed = (n + 1..=last)
            .map(|k| steps[k].react(|| request.last_observation()).clone())
            .find(|s| reading.forbids(s).is_none());
        if let Some(next) = allowed {
            return Played::new(
                next,
                Departure::Obeys,
                format!("the system prompt says: {rule}"),
            );
        }
    }
    if turn >= 1 && n < last && reading.finish_criterion().is_none() {
        let mut done = steps[last].react(|| request.last_observation()).clone();
        let missing = reading.missing_facts(&done);
        if let Some(content) = &done.content {
            done.content = Some(replace_facts(content, &missing, |_| "unknown".to_owned()));
        }
        return Played::new(
            done,
            Departure::StopsEarly,
            format!(
                "no criterion for a finished result; {} of {} steps skipped",
                last - n,
                steps.len()
            ),
        );
    }
    let (step, respelled) = reading.copy_spellings(step);
    let missing = reading.missing_facts(&step);
    if !missing.is_empty() {
        let why = format!(
            "not in the prompt: {}",
            missing
                .iter()
                .map(Fact::text)
                .collect::<Vec<_>>()
                .join(", ")
        );
        let previous_calls = n >= 1 && !steps[n - 1].tool_calls.is_empty();
        if previous_calls && turn < steps.len() + RECHECKS {
            let again = steps[n - 1].react(|| None).clone();
            return Played::new(reading.transform_calls(again).0, Departure::Recheck, why);
        }
        if step.tool_calls.is_empty() {
            if let Some(content) = &step.content {
                let answer = replace_facts(content, &missing, |_| "unknown".to_owned());
                return Played::new(text_step(answer), Departure::GiveUp, why);
            }
        }
    }
    let (step, departure) = reading.transform_calls(step);
    if departure == Departure::Scripted {
        if let Some((step, unshown)) = reading.invent_keys(&step) {
            return Played::new(
                step,
                Departure::InventedKeys,
                format!("JSON keys the request never shows: {}", unshown.join(", ")),
            );
        }
    }
    if respelled && departure == Departure::Scripted {
        return Played::new(
            step,
            Departure::CopiedSpelling,
            "a name the prompt spells in another Unicode form",
        );
    }
    let why = match departure {
        Departure::GuessedArguments => "a tool without a description, not called before",
        Departure::Misread => "a value copied from a table without a header",
        Departure::OneAtATime => "the system prompt asks for one lookup per call",
        _ => "",
    };
    Played::new(step, departure, why)
}

fn text_step(content: String) -> Step {
    Step {
        content: Some(content),
        tool_calls: Vec::new(),
        comment: None,
        unless_observation_mentions: None,
        provider_fault: None,
        computed: Vec::new(),
    }
}

/// A fact a step relies on: something it can only know from what it was sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Fact {
    /// A number of two digits or more, as written (`2980`, `14.5`, `1,204`).
    Number(String),
    /// A word with a non-ASCII letter (`Zoë`): copied, never typed from memory.
    Accented(String),
    /// A file name with an extension (`harrowmere/lighthouse.md`).
    File(String),
}

impl Fact {
    pub fn text(&self) -> &str {
        match self {
            Fact::Number(s) | Fact::Accented(s) | Fact::File(s) => s,
        }
    }
}

/// The facts in `text`, in order, without repeats (the digits of a file name belong to that
/// file's fact, not to numbers of their own).
pub fn facts(text: &str) -> Vec<Fact> {
    let mut out: Vec<Fact> = Vec::new();
    let mut push = |f: Fact| {
        if !out.contains(&f) {
            out.push(f);
        }
    };
    let mut without_files = text.to_owned();
    for token in tokens(text) {
        if is_file(token) {
            push(Fact::File(token.to_owned()));
            without_files = without_files.replace(token, " ");
        } else if !token.is_ascii() && token.chars().any(char::is_alphabetic) {
            push(Fact::Accented(token.to_owned()));
        }
    }
    for number in numbers(&without_files) {
        if number.chars().filter(char::is_ascii_digit).count() >= 2 {
            push(Fact::Number(number.to_owned()));
        }
    }
    out
}

/// Runs of letters, digits, combining marks and `_./-`.
fn tokens(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_alphanumeric() || is_mark(c) || matches!(c, '_' | '.' | '/' | '-')))
        .map(|t| t.trim_matches(|c| matches!(c, '.' | '-' | '/')))
        .filter(|t| !t.is_empty())
}

/// Combining diacritical marks (U+0300–U+036F), which NFD text carries after its letters.
fn is_mark(c: char) -> bool {
    ('\u{300}'..='\u{36f}').contains(&c)
}

fn is_file(token: &str) -> bool {
    const EXTENSIONS: &[&str] = &[
        "md", "txt", "csv", "json", "py", "toml", "yaml", "yml", "cfg", "ini",
    ];
    token.rsplit_once('.').is_some_and(|(stem, ext)| {
        !stem.is_empty() && stem.chars().any(char::is_alphabetic) && EXTENSIONS.contains(&ext)
    })
}

/// Numbers as written: digits with `,` or `.` between digit groups, and an optional sign.
fn numbers(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let digit = |k: usize| bytes.get(k).is_some_and(u8::is_ascii_digit);
    // `,` separates thousands only before exactly three digits (`2,980`, not `2020,2980`).
    let separator = |k: usize| match bytes[k] {
        b'.' => digit(k + 1),
        b',' => (1..=3).all(|d| digit(k + d)) && !digit(k + 4),
        _ => false,
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let glued = i > 0 && (is_word_byte(bytes[i - 1]) || bytes[i - 1].is_ascii_digit());
        if bytes[i].is_ascii_digit() && !glued {
            // A sign only where the `-` is not a hyphen inside a word (`telemetry-351`).
            let signed = i > 0
                && bytes[i - 1] == b'-'
                && (i < 2 || !(is_word_byte(bytes[i - 2]) || bytes[i - 2].is_ascii_digit()));
            let start = if signed { i - 1 } else { i };
            let mut j = i;
            while j < bytes.len() && (bytes[j].is_ascii_digit() || separator(j)) {
                j += 1;
            }
            if j >= bytes.len() || !is_word_byte(bytes[j]) {
                out.push(&text[start..j]);
            }
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b >= 0x80
}

/// A number's value and its decimals; `1,204` is 1204 (a thousands separator), `2,5` is 2.5.
fn value(number: &str) -> Option<(f64, usize)> {
    let thousands = number.split(',').skip(1).all(|group| {
        group
            .split('.')
            .next()
            .is_some_and(|digits| digits.len() == 3)
    });
    let plain = if thousands {
        number.replace(',', "")
    } else {
        number.replacen(',', ".", 1)
    };
    let decimals = plain.split_once('.').map_or(0, |(_, d)| d.len());
    plain.parse::<f64>().ok().map(|v| (v, decimals))
}

/// A table in a tool observation whose rows carry no header line: consecutive lines split by
/// the same delimiter into the same number (≥ 2) of fields, the first of which already holds a
/// number (a header names its columns).
#[derive(Debug, Clone, PartialEq)]
pub struct HeaderlessTable {
    pub rows: Vec<Vec<String>>,
}

fn headerless_tables(text: &str) -> Vec<HeaderlessTable> {
    let mut out = Vec::new();
    for delimiter in ['\t', ','] {
        let mut block: Vec<Vec<String>> = Vec::new();
        let mut flush = |block: &mut Vec<Vec<String>>| {
            let rows = std::mem::take(block);
            if rows.len() >= 2 && rows[0].iter().any(|f| value(f).is_some()) {
                out.push(HeaderlessTable { rows });
            }
        };
        for line in text.lines() {
            let fields: Vec<String> = line.split(delimiter).map(|f| f.trim().to_owned()).collect();
            let row = fields.len() >= 2 && fields.iter().all(|f| !f.is_empty());
            if !(row
                && block
                    .first()
                    .is_none_or(|first| first.len() == fields.len()))
            {
                flush(&mut block);
            }
            if row {
                block.push(fields);
            }
        }
        flush(&mut block);
    }
    out
}

/// What the scripted model reads in a request.
#[derive(Debug)]
pub struct Reading {
    /// Every message's text and every earlier tool call's arguments.
    text: String,
    /// Every number in `text`, as values.
    values: Vec<f64>,
    /// The system messages' text.
    system: String,
    /// Whether there is a system message at all, and what the first user message says.
    has_system: bool,
    first_user: String,
    /// Tables in tool results that have no header.
    headerless: Vec<HeaderlessTable>,
    /// Offered tools whose description says nothing beyond the name.
    undescribed: BTreeSet<String>,
    /// Tools the model has called earlier in this conversation.
    called: BTreeSet<String>,
    /// Non-ASCII words of the prompt by their [`skeleton`], as the prompt spells them.
    spellings: std::collections::BTreeMap<String, String>,
    /// The sentences of what came back since the model's last reply (tool results, user
    /// messages).
    answering: Vec<String>,
    /// The offered tools, in order: name and the string parameters a call needs (the
    /// required ones, or the first string property when none is required).
    offered: Vec<(String, Vec<String>)>,
}

impl Reading {
    pub fn of(request: &ChatRequest) -> Reading {
        let mut text = String::new();
        let mut system = String::new();
        let mut headerless = Vec::new();
        let mut called = BTreeSet::new();
        let mut first_user = None;
        for message in &request.messages {
            let body = message.text();
            match message.role.as_str() {
                "system" | "developer" => {
                    system.push_str(&body);
                    system.push('\n');
                }
                "tool" => headerless.extend(headerless_tables(&body)),
                "user" if first_user.is_none() => first_user = Some(body.clone()),
                _ => {}
            }
            text.push_str(&body);
            text.push('\n');
            for call in message.tool_calls.iter().flatten() {
                if let Some(name) = call.pointer("/function/name").and_then(Value::as_str) {
                    called.insert(name.to_owned());
                }
                if let Some(args) = call.pointer("/function/arguments").and_then(Value::as_str) {
                    text.push_str(args);
                    text.push('\n');
                }
            }
        }
        let values = numbers(&text)
            .into_iter()
            .filter_map(|n| value(n).map(|(v, _)| v))
            .collect();
        let undescribed = request
            .tools
            .iter()
            .flatten()
            .filter_map(|tool| {
                let function = tool.get("function")?;
                let name = function.get("name")?.as_str()?;
                let description = function
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                says_nothing(name, description).then(|| name.to_owned())
            })
            .collect();
        let mut spellings = std::collections::BTreeMap::new();
        for token in tokens(&text) {
            if !token.is_ascii() {
                spellings
                    .entry(skeleton(token))
                    .or_insert_with(|| token.to_owned());
            }
        }
        Reading {
            spellings,
            text,
            values,
            has_system: !system.is_empty(),
            system,
            first_user: first_user.unwrap_or_default(),
            headerless,
            undescribed,
            called,
            answering: sentences(&request.last_observation().unwrap_or_default())
                .map(rule_text)
                .collect(),
            offered: request
                .tools
                .iter()
                .flatten()
                .filter_map(string_parameters)
                .collect(),
        }
    }

    /// The call a role makes when it was offered tools its script never uses: its own
    /// instruction (the first line of what `step` says, less a leading `Label:`) put to the
    /// first offered tool whose needed parameters are all strings. A role told to instruct
    /// another but handed the toolkit tends to do the work itself — the role flipping CAMEL's
    /// authors report — and the division of labour the design meant disappears (C2).
    pub fn own_tool_call(&self, step: &Step) -> Option<ScriptedCall> {
        if !step.tool_calls.is_empty() {
            return None;
        }
        let line = step
            .content
            .as_deref()?
            .lines()
            .find(|l| !l.trim().is_empty())?;
        let line = match line.split_once(':') {
            Some((label, rest)) if !label.contains(' ') && !rest.trim().is_empty() => rest,
            _ => line,
        };
        let instruction = line.trim();
        if instruction.len() < 8 || instruction.starts_with(['{', '[', '<']) {
            return None;
        }
        let (name, params) = self.offered.iter().find(|(_, p)| !p.is_empty())?;
        let arguments = params
            .iter()
            .map(|p| (p.clone(), Value::String(instruction.to_owned())))
            .collect::<serde_json::Map<_, _>>();
        Some(ScriptedCall {
            name: name.clone(),
            arguments: Value::Object(arguments),
        })
    }

    /// The clause of the instructions (system messages and the first user message) that says
    /// when the work is finished, if any: a stop condition on what the model knows or has
    /// checked — "when you know the answer", "once the tests pass", "until the facts are
    /// found". "When you are done" or "when you're satisfied" names no such state: a model
    /// told only that has to guess when to stop (C8), and tends to stop at its first plausible
    /// result.
    pub fn finish_criterion(&self) -> Option<String> {
        const TRIGGERS: &[&str] = &["when", "once", "until", "after", "whenever"];
        const STATES: &[&str] = &[
            "know",
            "knows",
            "sure",
            "certain",
            "confident",
            "found",
            "verified",
            "checked",
            "confirmed",
            "pass",
            "passes",
            "passed",
            "succeed",
            "succeeds",
            "answer",
            "answered",
        ];
        const WINDOW: usize = 8;
        let instructions = format!("{}\n{}", self.system, self.first_user);
        let found = sentences(&instructions).find_map(|sentence| {
            let lower = sentence.to_lowercase();
            let words: Vec<&str> = lower
                .split(|c: char| !(c.is_alphanumeric() || c == '\''))
                .filter(|w| !w.is_empty())
                .collect();
            let stated = words.iter().enumerate().any(|(at, w)| {
                TRIGGERS.contains(w)
                    && words[at + 1..words.len().min(at + 1 + WINDOW)]
                        .iter()
                        .any(|s| STATES.contains(s))
            });
            stated.then(|| sentence.trim().to_owned())
        });
        found
    }

    /// Whether `fact` is somewhere in the prompt (numbers by value, at the fact's precision).
    fn has(&self, fact: &Fact) -> bool {
        match fact {
            Fact::Number(written) => {
                let Some((v, decimals)) = value(written) else {
                    return true;
                };
                let scale = 10f64.powi(decimals as i32);
                self.values
                    .iter()
                    .any(|p| ((p * scale).round() - v * scale).abs() < 0.5)
            }
            Fact::Accented(word) | Fact::File(word) => self.text.contains(word.as_str()),
        }
    }

    /// The facts `step` uses that the prompt does not hold (leaving out those the script
    /// marks as worked out by the model itself).
    pub fn missing_facts(&self, step: &Step) -> Vec<Fact> {
        let mut used = String::new();
        if let Some(content) = &step.content {
            used.push_str(content);
            used.push('\n');
        }
        for call in &step.tool_calls {
            used.push_str(&call.arguments_text());
            used.push('\n');
        }
        facts(&used)
            .into_iter()
            .filter(|f| !step.computed.iter().any(|c| c == f.text()) && !self.has(f))
            .collect()
    }

    /// `step` with every accented word the prompt holds only in another Unicode form (`Zoë`
    /// composed in the script, `Zoe` + U+0308 in the prompt) spelled as the prompt spells it:
    /// a model copies the characters it was given.
    pub fn copy_spellings(&self, mut step: Step) -> (Step, bool) {
        let mut changed = false;
        let mut respell = |text: &str| -> String {
            let mut out = text.to_owned();
            for fact in facts(text) {
                let Fact::Accented(word) = &fact else {
                    continue;
                };
                if self.text.contains(word.as_str()) {
                    continue;
                }
                if let Some(seen) = self.spellings.get(&skeleton(word)) {
                    out = out.replace(word.as_str(), seen);
                    changed = true;
                }
            }
            out
        };
        if let Some(content) = &step.content {
            step.content = Some(respell(content));
        }
        for call in &mut step.tool_calls {
            let text = call.arguments_text();
            let spelled = respell(&text);
            if spelled != text {
                call.arguments = serde_json::from_str(&spelled).unwrap_or(Value::String(spelled));
            }
        }
        (step, changed)
    }

    /// The step's tool calls as this model makes them: told to do one thing per call, it
    /// makes only the first call of a step and keeps only the first item of each list in its
    /// arguments (one condition, one document); arguments of a tool it has not used and was
    /// not told about are guessed; values copied from a header-less table come from
    /// the neighbouring column.
    pub fn transform_calls(&self, mut step: Step) -> (Step, Departure) {
        let mut departure = Departure::Scripted;
        if self.one_at_a_time() && step_combines(&step) {
            step.tool_calls.truncate(1);
            if let Some(call) = step.tool_calls.first_mut() {
                call.arguments = first_of_each_list(&call.arguments);
            }
            departure = Departure::OneAtATime;
        }
        for call in &mut step.tool_calls {
            if self.undescribed.contains(&call.name) && !self.called.contains(&call.name) {
                call.arguments = guessed_arguments(call);
                departure = Departure::GuessedArguments;
                continue;
            }
            let text = call.arguments_text();
            let misread = self.misread(&text);
            if misread != text {
                call.arguments = serde_json::from_str(&misread).unwrap_or(Value::String(misread));
                if departure == Departure::Scripted {
                    departure = Departure::Misread;
                }
            }
        }
        (step, departure)
    }

    /// `text` with every value it copies from a header-less table taken from the wrong column,
    /// as a model that cannot tell the columns apart reads it: a word from the next column, a
    /// number from the next column holding a number (or the one before).
    fn misread(&self, text: &str) -> String {
        if self.headerless.is_empty() {
            return text.to_owned();
        }
        let mut out = text.to_owned();
        for table in &self.headerless {
            for row in &table.rows {
                for (at, cell) in row.iter().enumerate() {
                    let word = cell.len() >= 3 && value(cell).is_none();
                    if word && replace_word(&out, cell, "\u{0}") != out {
                        out = replace_word(&out, cell, &row[(at + 1) % row.len()]);
                    }
                }
            }
        }
        for fact in facts(text) {
            let Fact::Number(written) = &fact else {
                continue;
            };
            let replacement = self.headerless.iter().find_map(|table| {
                table.rows.iter().find_map(|row| {
                    let at = row.iter().position(|f| f == written)?;
                    let numeric = |i: &usize| *i != at && value(&row[*i]).is_some();
                    (at + 1..row.len())
                        .find(numeric)
                        .or_else(|| (0..at).rev().find(numeric))
                        .map(|i| row[i].clone())
                })
            });
            if let Some(other) = replacement {
                out = replace_word(&out, written, &other);
            }
        }
        out
    }

    /// Whether the system prompt limits each tool call to one fact or lookup, or each reply
    /// to one tool call: "one fact per tool call", "never make more than one tool call per
    /// reply" (not "one instruction at a time", which is about the conversation).
    pub fn one_at_a_time(&self) -> bool {
        sentences(&self.system).any(|s| {
            let s = s.to_lowercase();
            s.match_indices("one ").any(|(at, _)| {
                let after = &s[at..s.len().min(at + 40)];
                ["per tool call", "per call", "tool call per"]
                    .iter()
                    .any(|p| after.contains(p))
            })
        })
    }

    /// Sentences of the system prompt that tell the model to rely on what it knows or to keep
    /// tool use to a minimum (the contradictory-instruction flaw: other sentences say to look
    /// everything up).
    pub fn told_to_answer_from_memory(&self) -> bool {
        sentences(&self.system).any(|s| {
            let s = s.to_lowercase();
            let negated = ["never", "do not", "don't", "not from"]
                .iter()
                .any(|n| s.contains(n));
            let from_memory = [
                "already know",
                "from memory",
                "own knowledge",
                "what you know",
            ]
            .iter()
            .any(|p| s.contains(p));
            let minimal = s.contains("tool") && (s.contains("minimum") || s.contains("minimal"));
            (from_memory && !negated) || minimal
        })
    }

    /// The system prompt's prohibitions (clauses between `.`, `;` and line ends), in order.
    pub fn prohibitions(&self) -> Vec<String> {
        sentences(&self.system)
            .filter(|s| {
                let s = s.to_lowercase();
                [
                    "never ",
                    "do not ",
                    "don't ",
                    "must not ",
                    "at most ",
                    "no more than ",
                    "only if ",
                ]
                .iter()
                .any(|p| s.contains(p))
            })
            .map(rule_text)
            .collect()
    }

    /// The prohibition of the system prompt that names a command or tool `step` uses, if any:
    /// a `never`/`do not`/`must not` sentence holding every word of the command's name
    /// (`run_tests` in "never run the tests yourself"; a plural counts as its word) and no
    /// word that limits its scope ("outside", "unless", "before", …).
    pub fn forbids(&self, step: &Step) -> Option<String> {
        forbidding(&self.prohibitions(), step)
    }

    /// The same for what the model is answering: a sentence of the tool results and user
    /// messages since its last reply ("Do not submit yourself: hand the change back") that
    /// forbids a command `step` uses. The latest word on the step, so it is obeyed even when
    /// no later step is left (see [`play`]).
    pub fn answer_forbids(&self, step: &Step) -> Option<String> {
        forbidding(&self.answering, step)
    }

    /// The question a model with no clear identity asks: when the prompt has no system
    /// message but its user message says who the model is, or the system prompt gives it two
    /// different identities.
    pub fn role_confusion(&self) -> Option<String> {
        if !self.has_system && self.first_user.trim_start().starts_with("You are") {
            return Some(
                "Understood. Those are instructions for an assistant; what is the task you want me to work on?"
                    .to_owned(),
            );
        }
        let roles = identities(&self.system);
        if roles.len() >= 2 {
            return Some(format!(
                "I have been told that I am {} and that I am {}. Which of these roles should I take before I start?",
                roles[0], roles[1]
            ));
        }
        None
    }

    /// A text reply that is one JSON object, to a request that asks for JSON, with each
    /// top-level key the request never shows (no example, no schema naming it) renamed the
    /// way a model names a field it was only told about in words: `final_answer` as
    /// `finalAnswer`, `subgoals` as `Subgoals`. The agent that reads the object by its own key
    /// names then cannot find them; the keys the model was shown (in a correction, say) are
    /// kept. `None` when nothing is renamed.
    pub fn invent_keys(&self, step: &Step) -> Option<(Step, Vec<String>)> {
        // A model that answers in JSON unasked chooses its own keys; only a request for JSON
        // sets keys the model has to match.
        if !step.tool_calls.is_empty() || !self.text.contains("JSON") {
            return None;
        }
        let content = step.content.as_deref()?;
        let Ok(Value::Object(object)) = serde_json::from_str::<Value>(content.trim()) else {
            return None;
        };
        let shown: BTreeSet<&str> = tokens(&self.text).collect();
        let unshown: Vec<String> = object
            .keys()
            .filter(|k| !shown.contains(k.as_str()))
            .cloned()
            .collect();
        if unshown.is_empty() {
            return None;
        }
        let renamed: serde_json::Map<String, Value> = object
            .into_iter()
            .map(|(k, v)| {
                let k = if unshown.contains(&k) {
                    invented_key(&k)
                } else {
                    k
                };
                (k, v)
            })
            .collect();
        let mut step = step.clone();
        step.content = Some(Value::Object(renamed).to_string());
        Some((step, unshown))
    }

    /// Answers `content` from memory: numbers the prompt does not hold are remembered wrong
    /// (about 8% off), other missing facts as `unknown`.
    fn answer_from_memory(&self, content: &str) -> String {
        let missing: Vec<Fact> = facts(content)
            .into_iter()
            .filter(|f| !self.has(f))
            .collect();
        replace_facts(content, &missing, |fact| match fact {
            Fact::Number(written) => match value(written) {
                Some((v, decimals)) => format!("{:.*}", decimals, v * 1.08 + 1.0),
                None => "unknown".to_owned(),
            },
            _ => "unknown".to_owned(),
        })
    }
}

/// A key as a model names a field it was told about only in words: words joined in
/// camelCase, a single word capitalised.
fn invented_key(key: &str) -> String {
    let mut out = String::new();
    for (i, word) in key
        .split(['_', '-', ' '])
        .filter(|w| !w.is_empty())
        .enumerate()
    {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            if i == 0 && key.contains(['_', '-', ' ']) {
                out.extend(first.to_lowercase());
            } else {
                out.extend(first.to_uppercase());
            }
            out.push_str(chars.as_str());
        }
    }
    if out == key {
        format!("{key}_value")
    } else {
        out
    }
}

/// Whether a step does several things at once: more than one call, or a call with a list of
/// more than one item (conditions, paths, columns).
fn step_combines(step: &Step) -> bool {
    fn long_list(v: &Value) -> bool {
        match v {
            Value::Array(items) => items.len() > 1 || items.iter().any(long_list),
            Value::Object(map) => map.values().any(long_list),
            _ => false,
        }
    }
    step.tool_calls.len() > 1
        || step.tool_calls.iter().any(|c| match &c.arguments {
            Value::String(raw) => serde_json::from_str(raw).is_ok_and(|v: Value| long_list(&v)),
            other => long_list(other),
        })
}

/// `arguments` with every list cut to its first item.
fn first_of_each_list(arguments: &Value) -> Value {
    match arguments {
        Value::Array(items) => Value::Array(items.iter().take(1).map(first_of_each_list).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), first_of_each_list(v)))
                .collect(),
        ),
        Value::String(raw) => match serde_json::from_str::<Value>(raw) {
            Ok(parsed @ (Value::Object(_) | Value::Array(_))) => {
                Value::String(first_of_each_list(&parsed).to_string())
            }
            _ => arguments.clone(),
        },
        other => other.clone(),
    }
}

/// A word without its diacritics: combining marks dropped and precomposed Latin-1 letters
/// mapped to their base letter, so that NFC and NFD spellings of a name compare equal.
fn skeleton(word: &str) -> String {
    const BASE: &str = "AAAAAAACEEEEIIIIDNOOOOO*OUUUUYTsaaaaaaaceeeeiiiidnooooo/ouuuuyty";
    word.chars()
        .filter(|c| !is_mark(*c))
        .map(|c| match c as u32 {
            0xC0..=0xFF => BASE.chars().nth(c as usize - 0xC0).unwrap_or(c),
            _ => c,
        })
        .collect()
}

/// Whether a tool description says nothing beyond the tool's name: empty, the name itself
/// (any case, `_` as space) or a bare signature `name(args)`.
fn says_nothing(name: &str, description: &str) -> bool {
    let d = description.trim().to_lowercase();
    let n = name.to_lowercase();
    d.is_empty()
        || d.replace('_', " ") == n.replace('_', " ")
        || (d.starts_with(&n) && d.ends_with(')') && !d.contains(". "))
}

/// Arguments guessed from a tool's name alone: the first value the script would send, under
/// the generic key `input`.
fn guessed_arguments(call: &ScriptedCall) -> Value {
    fn first_value(v: &Value) -> Option<Value> {
        match v {
            Value::Object(map) => map.values().find_map(first_value),
            Value::Array(items) => items.iter().find_map(first_value),
            Value::Null => None,
            other => Some(other.clone()),
        }
    }
    let arguments = match &call.arguments {
        Value::String(raw) => serde_json::from_str(raw).unwrap_or(Value::Null),
        other => other.clone(),
    };
    let input = first_value(&arguments).unwrap_or(Value::String(String::new()));
    serde_json::json!({ "input": input })
}

/// `You are a/an/the ROLE` phrases with distinct head nouns, in order (ROLE: up to four
/// words, ending before a relative clause or preposition).
fn identities(text: &str) -> Vec<String> {
    const STOP: &[&str] = &[
        "who", "that", "which", "and", "with", "for", "in", "of", "on", "to", "at", "working",
    ];
    let mut out: Vec<String> = Vec::new();
    let lower = text.to_lowercase();
    for (at, _) in lower.match_indices("you are ") {
        let rest = &lower[at + "you are ".len()..];
        let Some(after) = ["a ", "an ", "the "]
            .iter()
            .find_map(|article| rest.strip_prefix(article))
        else {
            continue;
        };
        let phrase = after
            .split(|c: char| !(c.is_alphanumeric() || c == ' ' || c == '-' || c == '\''))
            .next()
            .unwrap_or("");
        let role: Vec<&str> = phrase
            .split_whitespace()
            .take_while(|w| !STOP.contains(w))
            .take(4)
            .collect();
        let Some(noun) = role.last() else {
            continue;
        };
        if !out
            .iter()
            .any(|r| r.split_whitespace().last() == Some(noun))
        {
            out.push(role.join(" "));
        }
    }
    out
}

/// A word without a plural `s` (`tests` → `test`; short words such as `is` kept as they are).
fn singular(word: &str) -> &str {
    word.strip_suffix('s')
        .filter(|w| w.len() > 2)
        .unwrap_or(word)
}

/// An offered tool's name and the string parameters a call needs: every required parameter
/// when all of them are strings (none when one is not), else the first string property.
fn string_parameters(tool: &Value) -> Option<(String, Vec<String>)> {
    let function = tool.get("function")?;
    let name = function.get("name")?.as_str()?.to_owned();
    let properties = function
        .pointer("/parameters/properties")
        .and_then(Value::as_object);
    let is_string = |p: &str| {
        properties
            .and_then(|ps| ps.get(p))
            .and_then(|d| d.get("type"))
            .and_then(Value::as_str)
            == Some("string")
    };
    let required: Vec<String> = function
        .pointer("/parameters/required")
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let params = if !required.is_empty() {
        if required.iter().all(|p| is_string(p)) {
            required
        } else {
            Vec::new()
        }
    } else {
        properties
            .and_then(|ps| ps.keys().find(|k| is_string(k)).cloned())
            .into_iter()
            .collect()
    };
    Some((name, params))
}

/// The first of `rules` that forbids a command or tool `step` uses (see
/// [`Reading::forbids`]).
fn forbidding(rules: &[String], step: &Step) -> Option<String> {
    let commands = step.commands();
    if commands.is_empty() {
        return None;
    }
    rules
        .iter()
        .find(|rule| {
            let lower = rule.to_lowercase();
            let forbidding = ["never ", "do not ", "don't ", "must not "]
                .iter()
                .any(|p| lower.contains(p));
            let words: BTreeSet<&str> = lower
                .split(|c: char| !c.is_alphanumeric())
                .map(singular)
                .collect();
            // "never edit files outside the repository" limits where, it does not forbid;
            // "do not re-run the same failed edit" forbids one repetition, not the command.
            let scoped = [
                "outside",
                "unless",
                "except",
                "without",
                "before",
                "until",
                "other than",
                "instead",
                "same",
                "again",
                "twice",
                "repeat",
            ]
            .iter()
            .any(|q| lower.contains(q));
            forbidding
                && !scoped
                && commands.iter().any(|command| {
                    let lower = command.to_lowercase();
                    lower
                        .split(['_', '-'])
                        .filter(|w| !w.is_empty())
                        .all(|w| words.contains(singular(w)))
                })
        })
        .cloned()
}

/// A sentence as a rule: trimmed, without a list marker.
fn rule_text(sentence: &str) -> String {
    sentence
        .trim()
        .trim_start_matches(['-', '*', ' '])
        .to_owned()
}

/// Sentences: split at `.`, `!`, `?`, `;` followed by a space or line end, and at line ends.
fn sentences(text: &str) -> impl Iterator<Item = &str> {
    text.split(['\n', ';'])
        .flat_map(|line| {
            line.split(". ")
                .flat_map(|s| s.split("! "))
                .flat_map(|s| s.split("? "))
        })
        .filter(|s| s.trim().len() > 3)
}

/// `text` with each fact in `missing` replaced by `with(fact)`.
fn replace_facts(text: &str, missing: &[Fact], with: impl Fn(&Fact) -> String) -> String {
    let mut out = text.to_owned();
    for fact in missing {
        out = replace_word(&out, fact.text(), &with(fact));
    }
    out
}

/// Replaces whole-word occurrences of `word` (not inside a longer number or word).
fn replace_word(text: &str, word: &str, with: &str) -> String {
    if word.is_empty() {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(word) {
        let before = rest[..at].chars().next_back();
        let after = rest[at + word.len()..].chars().next();
        let inside = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        out.push_str(&rest[..at]);
        if inside(before) || inside(after) {
            out.push_str(word);
        } else {
            out.push_str(with);
        }
        rest = &rest[at + word.len()..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ChatRequest;
    use serde_json::json;

    fn request(messages: Value, tools: Value) -> ChatRequest {
        ChatRequest::parse(
            json!({"model": "m", "messages": messages, "tools": tools})
                .to_string()
                .as_bytes(),
        )
        .unwrap()
    }

    fn call(name: &str, arguments: Value) -> ScriptedCall {
        ScriptedCall {
            name: name.into(),
            arguments,
        }
    }

    fn tool_step(name: &str, arguments: Value) -> Step {
        Step {
            content: None,
            tool_calls: vec![call(name, arguments)],
            comment: None,
            unless_observation_mentions: None,
            provider_fault: None,
            computed: Vec::new(),
        }
    }

    fn tools() -> Value {
        json!([
            {"type": "function", "function": {"name": "table_lookup", "description": "Rows of a named table, filtered by column values.", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "calculator", "description": "Evaluates an arithmetic expression.", "parameters": {"type": "object"}}}
        ])
    }

    fn script() -> Vec<Step> {
        vec![
            tool_step("table_lookup", json!({"table": "population"})),
            tool_step("calculator", json!({"expression": "2980 + 4925"})),
            text_step("{\"answer\": \"7905\"}".into()),
        ]
    }

    fn after_table(table: &str, tools: Value) -> ChatRequest {
        request(
            json!([
                {"role": "system", "content": "You are a research assistant. Use the tools for every fact. When you know the answer, reply with it as JSON."},
                {"role": "user", "content": "What is the population of Old Quay and Hillside in 2020?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "table_lookup", "arguments": "{\"table\":\"population\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": table}
            ]),
            tools,
        )
    }

    #[test]
    fn a_task_sent_again_starts_the_work_over() {
        let task = "What is the population of Old Quay and Hillside in 2020?";
        let handed_back = request(
            json!([
                {"role": "system", "content": "You are a research assistant. Use the tools for every fact. When you know the answer, reply with it as JSON."},
                {"role": "user", "content": task},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "table_lookup", "arguments": "{\"table\":\"population\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "Old Quay 2980 | Hillside 4925"},
                {"role": "assistant", "content": "Old Quay and Hillside together have 7905 people."},
                {"role": "user", "content": task}
            ]),
            tools(),
        );
        let Played {
            step,
            departure,
            why,
        } = play(&script(), 2, &handed_back);
        assert_eq!(departure, Departure::StartsOver, "{why}");
        assert_eq!(step, script()[0], "the first step again");
        // The turn after the repeat plays the second step; a nudge that is not the task
        // word for word plays the script where it is.
        let mut messages = handed_back.messages.clone();
        messages.push(serde_json::from_value(json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "table_lookup", "arguments": "{\"table\":\"population\"}"}}]})).unwrap());
        messages.push(serde_json::from_value(json!({"role": "tool", "tool_call_id": "c2", "content": "Old Quay 2980 | Hillside 4925"})).unwrap());
        let next = ChatRequest {
            messages,
            ..handed_back.clone()
        };
        assert_eq!(play(&script(), 3, &next).step, script()[1]);
        assert_eq!(next.turns_since_task_repeated(), Some(1));
        let nudged = request(
            json!([
                {"role": "user", "content": task},
                {"role": "assistant", "content": "Old Quay and Hillside together have 7905 people."},
                {"role": "user", "content": "Reply with only a JSON object of the form {\"answer\": \"...\"}."}
            ]),
            tools(),
        );
        assert_eq!(nudged.turns_since_task_repeated(), None);
        assert_ne!(play(&script(), 1, &nudged).departure, Departure::StartsOver);
    }

    #[test]
    fn facts_are_numbers_files_and_accented_words() {
        let found = facts("Zoë read harrowmere/lighthouse.md: 2,980 people, 3 boats, 14.5%.");
        assert_eq!(
            found,
            [
                Fact::Accented("Zoë".into()),
                Fact::File("harrowmere/lighthouse.md".into()),
                Fact::Number("2,980".into()),
                Fact::Number("14.5".into()),
            ]
        );
        assert_eq!(value("1,204"), Some((1204.0, 0)));
        assert_eq!(value("2,5"), Some((2.5, 1)));
    }

    #[test]
    fn a_clean_prompt_plays_the_script() {
        let table = "district,year,population\nOld Quay,2020,2980\nHillside,2020,4925";
        let Played {
            step, departure, ..
        } = play(&script(), 1, &after_table(table, tools()));
        assert_eq!(departure, Departure::Scripted);
        assert_eq!(step, script()[1]);
    }

    #[test]
    fn a_fact_missing_from_the_prompt_makes_the_model_recheck_then_give_up() {
        let table = "district,year,population\nOld Quay,2020,[elided]\nHillside,2020,4925";
        let Played {
            step, departure, ..
        } = play(&script(), 1, &after_table(table, tools()));
        assert_eq!(departure, Departure::Recheck);
        assert_eq!(step.tool_calls, script()[0].tool_calls);
        // Past the script's end and its recheck, the answer step gives up.
        let Played {
            step, departure, ..
        } = play(&script(), 4, &after_table(table, tools()));
        assert_eq!(departure, Departure::GiveUp);
        assert_eq!(step.content.as_deref(), Some("{\"answer\": \"unknown\"}"));
    }

    #[test]
    fn without_a_criterion_for_done_the_model_stops_after_its_first_result() {
        let table = "district,year,population\nOld Quay,2020,2980\nHillside,2020,4925";
        let vague = |system: &str| {
            let mut r = after_table(table, tools());
            r.messages[0] =
                serde_json::from_value(json!({"role": "system", "content": system})).unwrap();
            r
        };
        // "When you are done" names no state that ends the work.
        let done = vague("You are a research assistant. Use the tools for every fact. When you are done, reply with JSON.");
        assert_eq!(done_reading(&done), None);
        let Played {
            step, departure, ..
        } = play(&script(), 1, &done);
        assert_eq!(departure, Departure::StopsEarly);
        // The calculator step is skipped; its result is not in the prompt, so the answer is
        // what the model has: nothing for the sum.
        assert!(step.tool_calls.is_empty());
        assert_eq!(step.content.as_deref(), Some("{\"answer\": \"unknown\"}"));
        // The first turn is played as written: the model has no result to stop at yet.
        assert_eq!(play(&script(), 0, &done).departure, Departure::Scripted);
        // Past the script's last step there is nothing left to skip.
        assert_ne!(play(&script(), 2, &done).departure, Departure::StopsEarly);
        // A stop condition on a state, in the system prompt or the first user message, is a
        // criterion: the script plays as written.
        for system in [
            "Use the tools. Submit once the tests pass.",
            "Keep giving me instructions until the facts are found.",
            "When you have the answer, reply without calling a tool.",
        ] {
            let r = vague(system);
            assert!(done_reading(&r).is_some(), "{system}");
            assert_eq!(
                play(&script(), 1, &r).departure,
                Departure::Scripted,
                "{system}"
            );
        }
        // "when" and "once" about something else are not criteria.
        let r = vague("Call several tools at once when their results do not depend on each other. When you're satisfied, reply.");
        assert_eq!(done_reading(&r), None);
    }

    #[test]
    fn a_forbidden_command_is_left_out() {
        let text = |t: &str| text_step(t.to_owned());
        let steps = vec![
            text("DISCUSSION\nFix the loop.\n\n```\nedit 9:9\n    x + 1\nend_of_edit\n```"),
            text("Now let me run the tests.\n\n```\nrun_tests\n```"),
            text("DISCUSSION\nAll tests pass. Submitting.\n\n```\nsubmit\n```"),
        ];
        assert_eq!(steps[1].commands(), ["run_tests"]);
        let with_system = |system: &str| {
            request(
                json!([
                    {"role": "system", "content": system},
                    {"role": "user", "content": "Fix the issue. Run the tests, and submit once they pass."},
                    {"role": "assistant", "content": "edit"},
                    {"role": "user", "content": "File updated."}
                ]),
                json!([]),
            )
        };
        let contradictory = with_system("You edit code. Keep commands to a minimum: never run the tests yourself, submissions are tested automatically.");
        let Played {
            step,
            departure,
            why,
        } = play(&steps, 1, &contradictory);
        assert_eq!(departure, Departure::Obeys, "{why}");
        assert_eq!(step, steps[2]);
        // A rule about something else, or a rule that is not a prohibition, leaves the step.
        for system in [
            "You edit code. Never edit files outside the repository.",
            "You edit code. Never push to the remote.",
            "You edit code. Run the tests before you submit.",
        ] {
            assert_eq!(
                play(&steps, 1, &with_system(system)).departure,
                Departure::Scripted,
                "{system}"
            );
        }
    }

    #[test]
    fn a_step_the_answered_message_forbids_is_handed_back() {
        let text = |t: &str| text_step(t.to_owned());
        let steps = vec![
            text("DISCUSSION\nAll tests pass. Submitting.\n\n```\nsubmit\n```"),
            text("The diff is the fix. Submitting again to confirm.\n\n```\nsubmit\n```"),
        ];
        let after_review = |review: &str| {
            request(
                json!([
                    {"role": "system", "content": "You edit code."},
                    {"role": "user", "content": "Fix the issue, then submit."},
                    {"role": "assistant", "content": "submit"},
                    {"role": "user", "content": review}
                ]),
                json!([]),
            )
        };
        let bounced = after_review(
            "Review the diff. Do not submit yourself: hand the change back to the maintainer, who submits reviewed changes.",
        );
        let Played {
            step,
            departure,
            why,
        } = play(&steps, 1, &bounced);
        assert_eq!(departure, Departure::Obeys, "{why}");
        assert!(step.commands().is_empty(), "{step:?}");
        assert!(
            step.content.as_deref().unwrap().contains("handing it back"),
            "{step:?}"
        );
        // The reviewer's usual request plays the script; so does the rule once it is no
        // longer what the model answers (a format error came after it).
        for usual in [
            "Review the diff. If you are satisfied, run submit again.",
            "Your edit failed. DO NOT re-run the same failed submit command.",
        ] {
            assert_eq!(
                play(&steps, 1, &after_review(usual)).departure,
                Departure::Scripted,
                "{usual}"
            );
        }
        let later = request(
            json!([
                {"role": "system", "content": "You edit code."},
                {"role": "user", "content": "Fix the issue, then submit."},
                {"role": "assistant", "content": "submit"},
                {"role": "user", "content": "Do not submit yourself: hand the change back."},
                {"role": "assistant", "content": "Handing it back."},
                {"role": "user", "content": "Your reply had no command. Reply with one command."}
            ]),
            json!([]),
        );
        assert_eq!(play(&steps, 2, &later).departure, Departure::Scripted);
    }

    #[test]
    fn an_instructor_handed_tools_does_its_instruction_itself() {
        let steps = vec![
            text_step("Instruction: Find the SKU of the Borealis Mini kettle.\nInput: None".into()),
            text_step("Instruction: Add up its 2023 sales.\nInput: None".into()),
        ];
        let first = |tools: Value| {
            request(
                json!([
                    {"role": "system", "content": "You are the Research Coordinator. You instruct the analyst."},
                    {"role": "user", "content": "Begin."}
                ]),
                tools,
            )
        };
        let toolkit = json!([
            {"type": "function", "function": {"name": "calculator", "description": "Evaluates an arithmetic expression.",
                "parameters": {"type": "object", "properties": {"expression": {"type": "string"}, "digits": {"type": "integer"}}, "required": ["expression", "digits"]}}},
            {"type": "function", "function": {"name": "search", "description": "Full-text search of the corpus.",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
        ]);
        let Played {
            step, departure, ..
        } = play(&steps, 0, &first(toolkit.clone()));
        assert_eq!(departure, Departure::DoesItself);
        // The calculator needs an integer too: the first tool a string fills is the search.
        assert_eq!(
            step.tool_calls,
            vec![call(
                "search",
                json!({"query": "Find the SKU of the Borealis Mini kettle."})
            )]
        );
        assert_eq!(step.content, None);
        // Without tools, later in the conversation, or for a role whose script calls tools,
        // the script plays.
        assert_eq!(
            play(&steps, 0, &first(json!([]))).departure,
            Departure::Scripted
        );
        let caller = vec![tool_step("search", json!({"query": "x"})), steps[0].clone()];
        assert_eq!(
            play(&caller, 1, &first(toolkit)).departure,
            Departure::Scripted
        );
    }

    fn done_reading(request: &ChatRequest) -> Option<String> {
        Reading::of(request).finish_criterion()
    }

    #[test]
    fn a_headerless_table_is_misread_by_column() {
        let table = "Old Quay,2020,2980\nHillside,2020,4925";
        let Played {
            step, departure, ..
        } = play(&script(), 1, &after_table(table, tools()));
        assert_eq!(departure, Departure::Misread);
        assert_eq!(
            step.tool_calls[0].arguments,
            json!({"expression": "2020 + 2020"})
        );
    }

    #[test]
    fn an_undescribed_tool_is_called_with_guessed_arguments_once() {
        let bare = json!([
            {"type": "function", "function": {"name": "table_lookup", "description": "table lookup"}},
            {"type": "function", "function": {"name": "calculator", "description": "calculator(expression)"}}
        ]);
        let first = request(
            json!([{"role": "system", "content": "You are an assistant."}, {"role": "user", "content": "Population?"}]),
            bare.clone(),
        );
        let Played {
            step, departure, ..
        } = play(&script(), 0, &first);
        assert_eq!(departure, Departure::GuessedArguments);
        assert_eq!(step.tool_calls[0].arguments, json!({"input": "population"}));
        // Once the model has called it, it knows the tool's arguments from the error.
        let table = "district,year,population\nOld Quay,2020,2980\nHillside,2020,4925";
        let Played { departure, .. } = play(&script(), 0, &after_table(table, bare));
        assert_eq!(departure, Departure::Scripted);
    }

    #[test]
    fn json_keys_the_request_never_shows_are_named_by_the_model() {
        let answer = Step {
            content: Some(r#"{"final_answer": "42", "evidence": "table row 3"}"#.into()),
            ..tool_step("x", json!({}))
        };
        let answer = Step {
            tool_calls: Vec::new(),
            ..answer
        };
        let ask = |system: &str| {
            request(
                json!([{"role": "system", "content": system}, {"role": "user", "content": "Give the final answer, 42 from table row 3."}]),
                json!([]),
            )
        };
        let shown = ask(
            r#"Reply with one JSON object: {"final_answer": "<value>", "evidence": "<sources>"}"#,
        );
        let played = play(std::slice::from_ref(&answer), 0, &shown);
        assert_eq!(played.departure, Departure::Scripted, "{}", played.why);

        let in_words = ask("Reply with one JSON object holding the bare value and the evidence.");
        let played = play(std::slice::from_ref(&answer), 0, &in_words);
        assert_eq!(played.departure, Departure::InventedKeys);
        assert!(played.why.contains("final_answer"), "{}", played.why);
        let reply: Value = serde_json::from_str(played.step.content.as_deref().unwrap()).unwrap();
        assert_eq!(
            reply,
            json!({"finalAnswer": "42", "evidence": "table row 3"})
        );

        assert_eq!(invented_key("specified_task"), "specifiedTask");
        assert_eq!(invented_key("subgoals"), "Subgoals");
        assert_eq!(invented_key("Verdict"), "Verdict_value");
        let not_json = Step {
            content: Some("Final answer: 42".into()),
            ..answer.clone()
        };
        assert_eq!(
            play(&[not_json], 0, &in_words).departure,
            Departure::Scripted
        );
        // Unasked for, JSON is the model's own format, with its own keys.
        let unasked = ask("Reply with the bare value and the evidence.");
        assert_eq!(
            play(std::slice::from_ref(&answer), 0, &unasked).departure,
            Departure::Scripted
        );
    }

    #[test]
    fn prompt_level_flaws_change_the_first_reply() {
        let ask = |system: &str| {
            request(
                json!([{"role": "system", "content": system}, {"role": "user", "content": "Population of Old Quay?"}]),
                tools(),
            )
        };
        let Played { step, departure: d, .. } = play(
            &script(),
            0,
            &ask("You are an assistant. Use the tools for every fact. Keep tool use to a minimum and answer from what you already know."),
        );
        assert_eq!(d, Departure::FromMemory);
        assert!(step.tool_calls.is_empty());
        assert_eq!(step.content.as_deref(), Some("{\"answer\": \"8538\"}"));
        let Played { departure: d, .. } = play(
            &script(),
            0,
            &ask("You are an assistant. Never answer from memory; use the tools."),
        );
        assert_eq!(d, Departure::Scripted);

        let rules: String = (0..REFUSAL_RULES)
            .map(|i| format!("Never do thing {i}.\n"))
            .collect();
        let Played {
            step, departure: d, ..
        } = play(&script(), 0, &ask(&rules));
        assert_eq!(d, Departure::Refusal);
        assert!(step.content.unwrap().contains("Never do thing 0"));

        let Played { departure: d, .. } = play(
            &script(),
            0,
            &ask("You are an autonomous programmer. You are the repository's reviewer; the user makes the changes."),
        );
        assert_eq!(d, Departure::RoleConfusion);
        let Played { departure: d, .. } = play(
            &script(),
            0,
            &ask("You are a careful researcher. As a researcher you cite sources."),
        );
        assert_eq!(d, Departure::Scripted);
        let no_system = request(
            json!([{"role": "user", "content": "You are an assistant.\n\nPopulation of Old Quay?"}]),
            tools(),
        );
        assert_eq!(
            play(&script(), 0, &no_system).departure,
            Departure::RoleConfusion
        );
        // Only the first reply reacts to the prompt's framing.
        let table = "district,year,population\nOld Quay,2020,2980\nHillside,2020,4925";
        assert_eq!(
            play(&script(), 1, &after_table(table, tools())).departure,
            Departure::Scripted
        );
    }

    #[test]
    fn told_one_fact_per_call_the_model_splits_nothing_and_drops_the_rest() {
        let script = vec![
            Step {
                tool_calls: vec![
                    call(
                        "table_lookup",
                        json!({"table": "population", "where": [{"year": 2020}, {"year": 2021}]}),
                    ),
                    call("search", json!({"query": "Old Quay"})),
                ],
                ..tool_step("x", json!({}))
            },
            text_step("{\"answer\": \"7905\"}".into()),
        ];
        let ask = |system: &str| {
            request(
                json!([{"role": "system", "content": system}, {"role": "user", "content": "Population?"}]),
                tools(),
            )
        };
        let played = play(
            &script,
            0,
            &ask("You are an assistant. Look up exactly one fact per tool call."),
        );
        assert_eq!(played.departure, Departure::OneAtATime);
        assert_eq!(played.step.tool_calls.len(), 1);
        assert_eq!(
            played.step.tool_calls[0].arguments,
            json!({"table": "population", "where": [{"year": 2020}]})
        );
        let played = play(
            &script,
            0,
            &ask("You are an assistant. Call several tools at once."),
        );
        assert_eq!(played.departure, Departure::Scripted);
    }

    #[test]
    fn nfd_text_does_not_hold_a_composed_name() {
        let script = vec![
            tool_step("search", json!({"query": "keeper"})),
            text_step("{\"answer\": \"Zoë Harrow\"}".into()),
        ];
        let seen = |doc: &str| {
            request(
                json!([
                    {"role": "system", "content": "You are an assistant. Reply with {\"answer\": \"...\"}."},
                    {"role": "user", "content": "Who kept the lighthouse?"},
                    {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{\"query\":\"keeper\"}"}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": doc}
                ]),
                json!([]),
            )
        };
        assert_eq!(
            play(&script, 1, &seen("Keeper: Zoë Harrow")).departure,
            Departure::Scripted
        );
        assert_eq!(
            play(&script, 1, &seen("Keeper: Ana Harrow")).departure,
            Departure::Recheck
        );
        // Shown only in its decomposed form, the name is copied as shown.
        let played = play(&script, 1, &seen("Keeper: Zoe\u{308} Harrow"));
        assert_eq!(played.departure, Departure::CopiedSpelling);
        assert_eq!(
            played.step.content.as_deref(),
            Some("{\"answer\": \"Zoe\u{308} Harrow\"}")
        );
        assert_eq!(skeleton("Zoë"), skeleton("Zoe\u{308}"));
    }
}
