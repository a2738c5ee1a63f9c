//! What the scripted model reads in a request ([`Reading`]), and the helpers that read
//! prompts: identities, rules that forbid a step, tools described by their name alone.

use super::*;

/// What the scripted model reads in a request.
#[derive(Debug)]
pub struct Reading {
    /// Every message's text and every earlier tool call's arguments.
    pub(super) text: String,
    /// Every number in `text`, as values.
    pub(super) values: Vec<f64>,
    /// The system messages' text.
    pub(super) system: String,
    /// Whether there is a system message at all, and what the first user message says.
    pub(super) has_system: bool,
    pub(super) first_user: String,
    /// Tables in tool results that have no header.
    pub(super) headerless: Vec<HeaderlessTable>,
    /// Offered tools whose description says nothing beyond the name.
    pub(super) undescribed: BTreeSet<String>,
    /// Tools the model has called earlier in this conversation.
    pub(super) called: BTreeSet<String>,
    /// Non-ASCII words of the prompt by their [`skeleton`], as the prompt spells them.
    pub(super) spellings: std::collections::BTreeMap<String, String>,
    /// The sentences of what came back since the model's last reply (tool results, user
    /// messages).
    pub(super) answering: Vec<String>,
    /// The offered tools, in order: name and the string parameters a call needs (the
    /// required ones, or the first string property when none is required).
    pub(super) offered: Vec<(String, Vec<String>)>,
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
    pub(super) fn has(&self, fact: &Fact) -> bool {
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
    pub(super) fn misread(&self, text: &str) -> String {
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
    pub(super) fn answer_from_memory(&self, content: &str) -> String {
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

/// A word without its diacritics: combining marks dropped and precomposed Latin-1 letters
/// mapped to their base letter, so that NFC and NFD spellings of a name compare equal.
pub(super) fn skeleton(word: &str) -> String {
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
pub(super) fn says_nothing(name: &str, description: &str) -> bool {
    let d = description.trim().to_lowercase();
    let n = name.to_lowercase();
    d.is_empty()
        || d.replace('_', " ") == n.replace('_', " ")
        || (d.starts_with(&n) && d.ends_with(')') && !d.contains(". "))
}

/// `You are a/an/the ROLE` phrases with distinct head nouns, in order (ROLE: up to four
/// words, ending before a relative clause or preposition).
pub(super) fn identities(text: &str) -> Vec<String> {
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
pub(super) fn singular(word: &str) -> &str {
    word.strip_suffix('s')
        .filter(|w| w.len() > 2)
        .unwrap_or(word)
}

/// An offered tool's name and the string parameters a call needs: every required parameter
/// when all of them are strings (none when one is not), else the first string property.
pub(super) fn string_parameters(tool: &Value) -> Option<(String, Vec<String>)> {
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
pub(super) fn forbidding(rules: &[String], step: &Step) -> Option<String> {
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
pub(super) fn rule_text(sentence: &str) -> String {
    sentence
        .trim()
        .trim_start_matches(['-', '*', ' '])
        .to_owned()
}

/// Sentences: split at `.`, `!`, `?`, `;` followed by a space or line end, and at line ends.
pub(super) fn sentences(text: &str) -> impl Iterator<Item = &str> {
    text.split(['\n', ';'])
        .flat_map(|line| {
            line.split(". ")
                .flat_map(|s| s.split("! "))
                .flat_map(|s| s.split("? "))
        })
        .filter(|s| s.trim().len() > 3)
}
