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

mod reading;
mod rewrite;
mod scan;

pub use reading::Reading;
use reading::*;
use rewrite::*;
use scan::*;
pub use scan::{facts, Fact, HeaderlessTable};

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
