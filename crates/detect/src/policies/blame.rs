//! The expert's blame on multi-agent chat logs (the Who&When task): which agent, at which turn,
//! made the decisive mistake. A chat log has no spans to localise and few errors to read, so the
//! expert measures what the literature finds decisive in such logs and answers
//! `agent NAME step N`:
//!
//! | order | the turn blamed | why a run fails from there |
//! |---|---|---|
//! | 1 | the first turn that substitutes made-up data (simulates, assumes, uses placeholder or sample data) and introduces facts later turns rely on | the team then reasons correctly from invented inputs; Who&When's annotators blame such turns, and TRAIL counts ungrounded facts among its most frequent errors |
//! | 2 | the first failure: a failed code execution is blamed on the turn that wrote the code, another failing turn (an error status, failure words, an exception's class name) on itself | an unrecovered failure is where the plan stops working |
//! | 2b | the first code execution that repeats an earlier one of its agent verbatim, blamed on the turn that issued it | the agent did not take in what it already had: a loop (TRAIL's resource abuse, AgentErrorBench's memory errors) |
//! | 3 | the first turn that introduces facts (numbers no earlier turn holds) which later turns rely on and the final answer carries | the answer rests on that claim and nothing re-derived it |
//! | 4 | the first acting turn | with no measurable departure, the opening plan is the decisive choice |
//!
//! The measurements come from two calls: an SQL overview (turns, agents, hand-offs, failed
//! executions) and a per-turn table computed by a shell pipeline (`jq` then `awk`): for every
//! turn its agent, kind, whether it failed, whether it substitutes made-up data, how many of its
//! numbers are new, how many of those later turns repeat, and how many the last turn with numbers
//! (the answer) carries, and whether an execution repeats an earlier one verbatim. Without the
//! shell tool an SQL table gives the first two flags only.
//! Agent names are written with `_` for spaces, as the answer grammar takes one word.

use crate::investigation::{Policy, View};
use crate::policies::quote;
use crate::transcript::TurnRecord;

/// The overview call for one trace.
pub fn overview(trace_id: &str) -> String {
    OVERVIEW.replace("{T}", &quote(trace_id))
}

/// The overview: size, agents, hand-offs and failed code executions.
const OVERVIEW: &str = "sql: SELECT COUNT(*) AS turns, COUNT(DISTINCT agent_name) AS agents,\n  COALESCE(SUM(kind = 'tool'), 0) AS executions, COALESCE(SUM(is_error), 0) AS failed,\n  COALESCE(SUM(agent_name <> prev), 0) AS handoffs\nFROM (SELECT agent_name, kind, is_error, LAG(agent_name) OVER (ORDER BY step) AS prev FROM spans WHERE trace_id = {T})";

/// Words that mark a failing turn (whole words).
const FAILURE_WORDS: &str =
    "error|errors|exception|traceback|failed|failure|unable|cannot|invalid|incorrect";
/// Exception class names (`BadRequestError`, `KeyError:`), lower-cased.
const EXCEPTION_NAMES: &str = "[a-z]+(error|exception)";
/// Phrases that mark made-up data standing in for real data.
const MADE_UP: &str = "simulat|assum|hypothetical|placeholder|dummy|mock|sample data|example data|for demonstration|fictional|made.up|let.s say|pretend";

/// The per-turn table as one shell pipeline (no newlines: the bash tool takes one line).
pub fn turn_table_bash() -> String {
    let jq = r#"jq -r '[.attributes["pathfinder.step_index"] // -1, (.attributes["gen_ai.agent.name"] // "?"), .kind, .status.code, (.attributes["output.value"] // "" | gsub("[\t\n\r]"; " "))] | @tsv' spans.jsonl"#;
    let awk = format!(
        concat!(
            "awk -F '\\t' '",
            "{{n++; st[n]=$1; a=$2; gsub(/ /,\"_\",a); ag[n]=a; kd[n]=$3; t=tolower($5);",
            " fl[n]=($4==\"ERROR\")?2:((t~/(^|[^a-z])({fw})([^a-z]|$)/ || t~/{ex}([^a-z]|$)/)?1:0);",
            " rp[n]=0; if(kd[n]==\"tool\"){{if(($2 SUBSEP $5) in said) rp[n]=1; said[$2 SUBSEP $5]=1}}",
            " mu[n]=(t~/{mu}/)?1:0; s=$5;",
            " while(match(s,/[0-9][0-9,.]*[0-9]/)){{v=substr(s,RSTART,RLENGTH); s=substr(s,RSTART+RLENGTH); gsub(/,/,\"\",v);",
            " if(!((n,v) in h)){{h[n,v]=1; nv[n]=nv[n] \" \" v}}}}",
            " if(kd[n]!=\"tool\" && nv[n]!=\"\") last=n}}",
            " END{{print \"step agent kind failed made_up novel relied carried repeats\";",
            " for(i=1;i<=n;i++){{nov=0; rel=0; car=0; c=split(nv[i],vs,\" \");",
            " for(j=1;j<=c;j++){{v=vs[j]; if(v in seen) continue; nov++;",
            " for(k=i+1;k<=n;k++) if((k,v) in h){{rel++; break}}",
            " if(last>i && ((last,v) in h)) car++}}",
            " for(j=1;j<=c;j++) seen[vs[j]]=1;",
            " print st[i], ag[i], kd[i], fl[i], mu[i], nov, rel, car, rp[i]}}}}'"
        ),
        fw = FAILURE_WORDS,
        ex = EXCEPTION_NAMES,
        mu = MADE_UP,
    );
    format!("bash: {jq} | sort -n -s -k1,1 | {awk}")
}

/// The per-turn table in SQL (when the shell tool is off): failures and made-up data only.
pub fn turn_table_sql(trace_id: &str) -> String {
    let like = |words: &str| {
        words
            .split('|')
            .map(|w| format!("lower(output) LIKE '%{}%'", w.replace('.', "_")))
            .collect::<Vec<_>>()
            .join(" OR ")
    };
    format!(
        "sql: SELECT step, replace(agent_name, ' ', '_') AS agent, kind,\n  CASE WHEN is_error = 1 THEN 2 WHEN {} THEN 1 ELSE 0 END AS failed,\n  ({}) AS made_up, 0 AS novel, 0 AS relied, 0 AS carried, 0 AS repeats\nFROM spans WHERE trace_id = {} ORDER BY step",
        like(FAILURE_WORDS),
        like(MADE_UP),
        quote(trace_id)
    )
}

/// One row of the per-turn table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    pub step: i64,
    pub agent: String,
    pub tool: bool,
    /// 2: an error status (a failed execution); 1: failure words; 0: neither.
    pub failed: u8,
    pub made_up: bool,
    pub novel: u32,
    pub relied: u32,
    pub carried: u32,
    /// An execution identical (agent and text) to an earlier one.
    pub repeats: bool,
}

impl Turn {
    /// A turn with its step, agent, kind and failure, and nothing else measured on it (no
    /// made-up data, new facts or repeats).
    pub fn measured_as(step: i64, agent: &str, tool: bool, failed: u8) -> Turn {
        Turn {
            step,
            agent: agent.into(),
            tool,
            failed,
            made_up: false,
            novel: 0,
            relied: 0,
            carried: 0,
            repeats: false,
        }
    }
}

/// Reads the per-turn table (the header line, then one row per turn; a trailing `(N rows)`
/// line of the SQL tool is skipped).
pub fn parse_turns(observation: &str) -> Vec<Turn> {
    let mut lines = observation.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let cols: Vec<&str> = header.split_whitespace().collect();
    let at = |name: &str| cols.iter().position(|c| *c == name);
    let repeats = at("repeats");
    let (Some(s), Some(a), Some(k), Some(f), Some(m), Some(nv), Some(r), Some(c)) = (
        at("step"),
        at("agent"),
        at("kind"),
        at("failed"),
        at("made_up"),
        at("novel"),
        at("relied"),
        at("carried"),
    ) else {
        return Vec::new();
    };
    lines
        .filter_map(|line| {
            let v: Vec<&str> = line.split_whitespace().collect();
            let num = |i: usize| v.get(i).and_then(|x| x.parse::<i64>().ok());
            Some(Turn {
                step: num(s)?,
                agent: v.get(a)?.to_string(),
                tool: *v.get(k)? == "tool",
                failed: num(f)?.clamp(0, 2) as u8,
                made_up: num(m)? > 0,
                novel: num(nv)?.max(0) as u32,
                relied: num(r)?.max(0) as u32,
                carried: num(c)?.max(0) as u32,
                repeats: repeats.and_then(num).is_some_and(|x| x > 0),
            })
        })
        .collect()
}

/// The blame measurements a policy makes before choosing, `made` of them already made: the
/// overview (SQL), then the per-turn table (the shell pipeline where the run offers `bash:`,
/// else the SQL table). `None` once both are made, or when the run offers neither tool.
pub fn measurement(view: &View<'_>, made: usize) -> Option<String> {
    let sql = view.system_prompt.contains("\nsql: ");
    let bash = view.system_prompt.contains("\nbash: ");
    let mut calls = Vec::new();
    if sql {
        calls.push(format!(
            "Count the log's turns, agents and hand-offs.\n{}",
            overview(view.trace_id)
        ));
    }
    if bash {
        calls.push(format!("Measure each turn.\n{}", turn_table_bash()));
    } else if sql {
        calls.push(format!(
            "Measure each turn.\n{}",
            turn_table_sql(view.trace_id)
        ));
    }
    calls.into_iter().nth(made)
}

/// The per-turn table an investigation measured, as text: the last observation that reads as
/// one (empty when none does).
pub fn measured_table(turns: &[TurnRecord]) -> &str {
    turns
        .iter()
        .rev()
        .map(|t| t.observation.text.as_str())
        .find(|t| !parse_turns(t).is_empty())
        .unwrap_or_default()
}

/// The per-turn table an investigation measured, read ([`measured_table`]).
pub fn measured(turns: &[TurnRecord]) -> Vec<Turn> {
    parse_turns(measured_table(turns))
}

/// Only the blame measurements, then no answer: training and evaluation read the per-turn
/// table out of its transcript ([`measured`]) and choose offline.
pub struct Measure {
    made: usize,
}

impl Measure {
    pub fn new() -> Measure {
        Measure { made: 0 }
    }
}

impl Default for Measure {
    fn default() -> Self {
        Measure::new()
    }
}

impl Policy for Measure {
    fn name(&self) -> String {
        "blame-measurements".into()
    }

    fn act(&mut self, view: &View<'_>) -> Result<String, String> {
        if !view.chatlog {
            return Err("the blame measurements read chat logs; this trace is not one".into());
        }
        let call = measurement(view, self.made);
        self.made += 1;
        Ok(call.unwrap_or_else(|| "answer: none | measured only".into()))
    }

    fn subagent(&self, _task: &str) -> Result<Box<dyn Policy>, String> {
        Err("the blame measurements do not delegate".into())
    }
}

/// Agents that state the task rather than act on it.
pub fn task_giver(agent: &str) -> bool {
    ["human", "user"]
        .iter()
        .any(|g| agent.eq_ignore_ascii_case(g))
}

/// The turn that wrote what execution `i` ran: the last acting turn before it that is not
/// itself an execution.
fn author<'a>(acting: &[&'a Turn], i: usize) -> Option<&'a Turn> {
    acting[..i].iter().rev().find(|a| !a.tool).copied()
}

/// The blamed agent and step, and why (see the module's table). `None` for a log with no
/// acting turn.
pub fn blame(turns: &[Turn]) -> Option<(String, i64, String)> {
    let acting: Vec<&Turn> = turns.iter().filter(|t| !task_giver(&t.agent)).collect();
    let opening = acting.iter().find(|t| !t.tool).map(|t| t.step);
    let later = |t: &&&Turn| !t.tool && Some(t.step) != opening;
    let found = |t: &Turn, why: String| Some((t.agent.clone(), t.step, why));
    if let Some(t) = acting
        .iter()
        .filter(later)
        .find(|t| t.made_up && t.relied > 0)
    {
        return found(
            t,
            format!(
                "turn {} substitutes made-up data and {} of its new facts are relied on later",
                t.step, t.relied
            ),
        );
    }
    for (i, t) in acting.iter().enumerate() {
        if t.tool && t.failed == 2 {
            if let Some(author) = author(&acting, i) {
                return found(
                    author,
                    format!(
                        "the code execution at turn {} failed; turn {} wrote that code",
                        t.step, author.step
                    ),
                );
            }
        }
        if !t.tool && t.failed > 0 && Some(t.step) != opening {
            return found(
                t,
                format!("turn {} is the first to report a failure", t.step),
            );
        }
    }
    for (i, t) in acting.iter().enumerate() {
        if t.tool && t.repeats {
            if let Some(author) = author(&acting, i) {
                return found(
                    author,
                    format!(
                        "the execution at turn {} repeats an earlier one verbatim; turn {} issued it",
                        t.step, author.step
                    ),
                );
            }
        }
    }
    if let Some(t) = acting
        .iter()
        .filter(later)
        .find(|t| t.relied > 0 && t.carried > 0)
    {
        return found(
            t,
            format!(
                "turn {} introduces {} new fact(s); {} recur later and {} reach the final answer",
                t.step, t.novel, t.relied, t.carried
            ),
        );
    }
    let first = acting.iter().find(|t| !t.tool)?;
    found(
        first,
        format!(
            "no failure, made-up data or unsupported claim measured; the opening turn {} set the plan",
            first.step
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(step: i64, agent: &str, tool: bool, failed: u8, made_up: bool, rel: u32) -> Turn {
        Turn {
            step,
            agent: agent.into(),
            tool,
            failed,
            made_up,
            novel: rel,
            relied: rel,
            carried: rel.min(1),
            repeats: false,
        }
    }

    #[test]
    fn the_table_reads_back_and_the_rules_apply_in_order() {
        let obs = "step agent kind failed made_up novel relied carried\n0 Planner agent 1 0 3 0 0\n1 Coder agent 0 0 2 2 1\n2 Computer_terminal tool 2 0 0 0 0\n3 Coder agent 0 1 4 3 2\n";
        let turns = parse_turns(obs);
        assert_eq!(turns.len(), 4);
        assert!(turns[2].tool);
        assert_eq!(turns[3].relied, 3);
        // Rule 1: made-up data relied on later wins over the earlier failed execution.
        let (agent, step, _) = blame(&turns).unwrap();
        assert_eq!((agent.as_str(), step), ("Coder", 3));
        // Without it, the failed execution is blamed on the turn that wrote the code.
        let mut t = turns.clone();
        t[3].made_up = false;
        assert_eq!(blame(&t).unwrap().1, 1);
        // Without a failure, the first turn whose new facts reach the answer; the opening
        // turn's failure words do not count (it states the task).
        t[2].failed = 0;
        assert_eq!(blame(&t).unwrap().1, 1);
        // A repeated execution (the optional column) is blamed on the turn that issued it.
        let looped = parse_turns("step agent kind failed made_up novel relied carried repeats\n0 A agent 0 0 0 0 0 0\n1 B agent 0 0 0 0 0 0\n2 B tool 0 0 0 0 0 0\n3 B agent 0 0 0 0 0 0\n4 B tool 0 0 0 0 0 1\n");
        assert!(looped[4].repeats && !turns[2].repeats);
        assert_eq!(blame(&looped).unwrap().1, 3);
        // Nothing measured: the opening turn.
        let quiet = vec![
            turn(0, "human", false, 0, false, 0),
            turn(1, "A", false, 0, false, 0),
        ];
        assert_eq!(
            blame(&quiet).unwrap(),
            ("A".into(), 1, blame(&quiet).unwrap().2)
        );
        assert!(blame(&[]).is_none());
        // An SQL row count line and a garbled row are skipped.
        assert_eq!(
            parse_turns(
                "step agent kind failed made_up novel relied carried\n0 A agent 0 0 0 0 0\n(1 row)"
            )
            .len(),
            1
        );
        assert!(parse_turns("no table").is_empty());
    }

    #[test]
    fn the_measurements_follow_the_tools_offered_and_the_measuring_policy_answers_nothing() {
        let view = |prompt: &'static str, chatlog: bool| View {
            role: crate::env::Actor::Main,
            trace_id: "t1",
            task: None,
            chatlog,
            system_prompt: prompt,
            turns: &[],
            turns_left: 5,
            tokens_left: 10_000,
            reference: None,
        };
        let both = view("tools:\nsql: SELECT\nbash: PIPELINE", true);
        assert!(measurement(&both, 0)
            .unwrap()
            .contains("COUNT(DISTINCT agent_name)"));
        assert!(measurement(&both, 1).unwrap().contains("bash: jq"));
        assert!(measurement(&both, 2).is_none());
        // Without the shell the table is SQL's; without SQL there is no overview.
        let sql = view("tools:\nsql: SELECT", true);
        assert!(measurement(&sql, 1).unwrap().contains("AS made_up"));
        let bash = view("tools:\nbash: PIPELINE", true);
        assert!(measurement(&bash, 0).unwrap().contains("bash: jq"));
        assert!(measurement(&bash, 1).is_none());
        let mut m = Measure::new();
        assert!(m.act(&both).unwrap().contains("sql: "));
        assert!(m.act(&both).unwrap().contains("bash: "));
        assert!(m.act(&both).unwrap().starts_with("answer: none"));
        assert!(Measure::new().act(&view("x", false)).is_err());
        // The table is read back from the last observation that holds one.
        assert!(measured(&[]).is_empty());
    }
}
