//! Real weights: the baselines' fixed prompt under SmolLM2-135M-Instruct's tokenizer leaves
//! room for the trace within the default budget.
//!
//! Looks for `$PATHFINDER_SMOLLM2_GGUF`, else the model cache (`pathfinder model fetch
//! smollm2-135m`). When the file is missing the test fails under CI (`CI=true`) and is skipped
//! with a message otherwise.

use model::{DType, Device};
use policy::baseline::{self, BaselineOptions};
use policy::PolicyModel;

#[test]
fn the_default_budget_leaves_smollm2_room_for_the_trace() {
    let Some(path) = model::testing::smollm2_weights() else {
        return;
    };
    let pm = PolicyModel::load(&path, DType::F32, &Device::Cpu).unwrap();
    let catalog = taxonomy::Catalog::embedded().unwrap();
    let system = baseline::system_prompt(&catalog);
    let system_tokens = pm.tokenizer.encode(&system, false).unwrap().len();
    let options = BaselineOptions::default();
    let room = baseline::trace_budget(&pm, &system, &"0".repeat(32), &options).unwrap();
    eprintln!(
        "system prompt {system_tokens} tokens; room for the trace {room} of {}",
        options.max_prompt_tokens
    );
    assert!(room >= 400, "{system_tokens} system tokens leave {room}");
    // A long trace is cut to that room, keeping both ends.
    let text: String = (0..400).map(|i| format!("span {i} ok\n")).collect();
    let cut = baseline::fit_tokens(&pm.tokenizer, &text, room).unwrap();
    assert!(pm.tokenizer.encode(&cut, false).unwrap().len() <= room);
    assert!(
        cut.starts_with("span 0 ok") && cut.ends_with("span 399 ok\n"),
        "{cut}"
    );
    assert!(cut.contains("chars cut"));
}
