//! The trainer's math on a tiny random model: gradients of the scored log-probabilities,
//! values and entropies reach every LoRA factor and the value head and equal finite
//! differences (so no fused op without a backward hides on the path), PPO moves probability
//! towards rewarded replies under both baselines, and the warm start lowers the
//! demonstrations' negative log-likelihood.

use model::{AdamW, AdamWConfig, Arch, DType, Device, Gradients, LoraConfig, Model, Tensor};
use policy::{ActionGrammar, Conversation};
use rl::config::{Baseline, PpoConfig};
use rl::ppo::{self, Role, Sample};

fn tiny(dtype: DType, seed: u64) -> (Model, model::ChatTokenizer) {
    let config = model::testing::tiny_config(Arch::Llama, false, 512).unwrap();
    let mut m = Model::random(config, dtype, &Device::Cpu, seed).unwrap();
    m.add_adapter(
        "a",
        LoraConfig {
            rank: 2,
            ..LoraConfig::default()
        },
        seed + 1,
    )
    .unwrap();
    m.add_value_head("a").unwrap();
    (m, model::testing::tiny_tokenizer().unwrap())
}

/// A conversation whose reply is an answer: constrained tokens, then free evidence.
fn answer_conversation(tok: &model::ChatTokenizer, id: &str, evidence: &str) -> Conversation {
    let catalog = taxonomy::Catalog::embedded().unwrap();
    let grammar = ActionGrammar::new(tok, &catalog, &policy::grammar::LEARNED_TOOLS).unwrap();
    let format = policy::ChatFormat::of(tok).unwrap();
    let mut c = Conversation::new();
    c.push_message(tok, "system", "Find the bug.").unwrap();
    c.push_message(tok, "user", "Investigate.").unwrap();
    c.open_reply(tok).unwrap();
    let mut reply = grammar.head_tokens(tok, "answer").unwrap();
    reply.extend(
        grammar
            .answer_tokens(tok, id, "tools.schema")
            .unwrap()
            .unwrap(),
    );
    reply.extend(tok.encode(&format!(" {evidence}"), false).unwrap());
    reply.push(format.im_end);
    let allowed = grammar.allowed_sets(&reply);
    assert!(allowed.iter().any(Option::is_some) && allowed.iter().any(Option::is_none));
    c.push_reply(tok, format, &reply, allowed).unwrap();
    c.check().unwrap();
    c
}

fn scalar(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap()
}

fn objective(m: &Model, c: &Conversation) -> Tensor {
    let s = ppo::score(m, Some("a"), c, true, true).unwrap();
    let lp = s.logprobs.sum_all().unwrap();
    let v = s.values.unwrap().sum_all().unwrap();
    let h = s.entropy.unwrap().sum_all().unwrap();
    ((lp + v).unwrap() + (h * 0.5).unwrap()).unwrap()
}

#[test]
fn scored_gradients_reach_every_adapter_parameter_and_match_finite_differences() {
    let (m, tok) = tiny(DType::F64, 11);
    // B starts at zero (the adapter is the identity), which would make A's gradient zero.
    for (i, (_, pair)) in m.adapter("a").unwrap().pairs().enumerate() {
        let shape = pair.b.as_tensor().dims().to_vec();
        let r = Tensor::randn(0f64, 0.3, shape, &Device::Cpu).unwrap();
        pair.b.set(&r).unwrap();
        let _ = i;
    }
    let vh = m.adapter("a").unwrap().value_head().unwrap().clone();
    vh.weight
        .set(&Tensor::randn(0f64, 0.3, vh.weight.dims(), &Device::Cpu).unwrap())
        .unwrap();
    let c = answer_conversation(&tok, "P16", "RecursionError");
    let vars = m.trainable_vars("a").unwrap();
    let mut grads = Gradients::new(vars.clone());
    grads.accumulate(&objective(&m, &c)).unwrap();
    assert!(
        grads.missing().is_empty(),
        "no gradient for {:?}",
        grads.missing()
    );
    let h = 1e-6;
    for (i, var) in vars.iter().enumerate() {
        let g = grads
            .get(i)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let base = var
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        // Two elements of each parameter: the first and the largest-gradient one.
        let argmax = g
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
            .map(|(k, _)| k)
            .unwrap();
        for k in [0, argmax] {
            let at = |delta: f64| {
                let mut v = base.clone();
                v[k] += delta;
                var.set(&Tensor::from_vec(v, var.dims(), &Device::Cpu).unwrap())
                    .unwrap();
                scalar(&objective(&m, &c))
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            at(0.0);
            let err = (fd - g[k]).abs() / (fd.abs().max(g[k].abs()).max(1e-6));
            assert!(
                err < 1e-4,
                "parameter {i} element {k}: autograd {} vs finite differences {fd}",
                g[k]
            );
        }
    }
}

fn train_towards_good(baseline: Baseline) -> (f64, f64) {
    let (mut m, tok) = tiny(DType::F32, 21);
    let good = answer_conversation(&tok, "P16", "recursion");
    let bad = answer_conversation(&tok, "C3", "loop");
    let lp = |m: &Model, c: &Conversation| {
        scalar(
            &ppo::score(m, Some("a"), c, false, false)
                .unwrap()
                .logprobs
                .sum_all()
                .unwrap(),
        )
    };
    let (g0, b0) = (lp(&m, &good), lp(&m, &bad));
    let cfg = PpoConfig {
        baseline,
        lr: 1e-2,
        epochs: 2,
        ..PpoConfig::default()
    };
    let mut opt = AdamW::new(
        m.trainable_vars("a").unwrap(),
        AdamWConfig {
            lr: cfg.lr,
            ..AdamWConfig::default()
        },
    )
    .unwrap();
    let batch = vec![
        Sample {
            role: Role::Detector,
            conversation: good.clone(),
            reward: 1.0,
            group: 0,
        },
        Sample {
            role: Role::Detector,
            conversation: bad.clone(),
            reward: -1.0,
            group: 0,
        },
    ];
    let mut kls = Vec::new();
    for _ in 0..4 {
        let stats = ppo::update(
            &mut m,
            "a",
            &mut opt,
            &batch,
            &cfg,
            0.01,
            &collective::Single,
        )
        .unwrap();
        assert!(stats.tokens > 0 && stats.kl.is_finite() && stats.grad_norm > 0.0);
        kls.push(stats.kl);
    }
    // The KL to the base is measured before each update: zero for a fresh adapter (LoRA's B
    // starts at zero), then growing as the adapter moves away from the base.
    assert!(
        kls[0].abs() < 1e-9,
        "{baseline:?}: KL before any update {kls:?}"
    );
    assert!(
        kls.windows(2).all(|w| w[1] > w[0]),
        "{baseline:?}: KL to the base did not grow: {kls:?}"
    );
    (lp(&m, &good) - g0, lp(&m, &bad) - b0)
}

#[test]
fn ppo_raises_the_rewarded_reply_and_lowers_the_punished_one() {
    for baseline in [Baseline::Gae, Baseline::Group] {
        let (up, down) = train_towards_good(baseline);
        assert!(
            up > 0.0,
            "{baseline:?}: rewarded reply's log-probability fell by {up}"
        );
        assert!(
            down < 0.0,
            "{baseline:?}: punished reply's log-probability rose by {down}"
        );
    }
}

/// `steps` warm-start updates of adapter `a` on `demos` (AdamW, lr 1e-2), with what each measured.
fn warm_start(
    m: &mut Model,
    demos: &[Conversation],
    steps: usize,
    decision_weight: f64,
    measure_kl: bool,
) -> Vec<ppo::SftStats> {
    let mut opt = AdamW::new(
        m.trainable_vars("a").unwrap(),
        AdamWConfig {
            lr: 1e-2,
            ..AdamWConfig::default()
        },
    )
    .unwrap();
    (0..steps)
        .map(|_| {
            ppo::sft_step(
                m,
                "a",
                &mut opt,
                demos,
                ppo::SftStep {
                    max_grad_norm: 1.0,
                    decision_weight,
                    measure_kl,
                },
                &collective::Single,
            )
            .unwrap()
        })
        .collect()
}

#[test]
fn the_warm_start_lowers_the_demonstrations_loss_and_leaves_the_base_alone() {
    let (mut m, tok) = tiny(DType::F32, 31);
    let demos = vec![
        answer_conversation(&tok, "P16", "RecursionError in resolve_ref"),
        answer_conversation(&tok, "P2", "stream cut"),
    ];
    let before = ppo::nll(&m, Some("a"), &demos).unwrap();
    let base_before = ppo::nll(&m, None, &demos).unwrap();
    let kls: Vec<f64> = warm_start(&mut m, &demos, 6, 1.0, true)
        .iter()
        .map(|s| s.kl.unwrap())
        .collect();
    assert!(
        kls[0].abs() < 1e-9 && kls[5] > kls[1],
        "KL to the base: {kls:?}"
    );
    let after = ppo::nll(&m, Some("a"), &demos).unwrap();
    assert!(after < before - 0.05, "nll {before} -> {after}");
    assert_eq!(ppo::nll(&m, None, &demos).unwrap(), base_before);
}

/// Log-probability of the tokens the grammar left a choice (the answer's type and component).
fn decision_logprob(m: &Model, c: &Conversation) -> f64 {
    let s = ppo::score(m, Some("a"), c, false, false).unwrap();
    let lp: Vec<f32> = s.logprobs.to_vec1().unwrap();
    let choices = c
        .generated
        .iter()
        .zip(&c.allowed)
        .filter(|(g, _)| **g)
        .map(|(_, a)| a.as_ref().is_some_and(|set| set.len() > 1));
    lp.iter()
        .zip(choices)
        .filter(|(_, choice)| *choice)
        .map(|(x, _)| f64::from(*x))
        .sum()
}

#[test]
fn weighting_the_decisions_teaches_the_answer_faster_than_the_plain_loss() {
    // Long evidence: as in a real demonstration, the answer's choices are a few tokens of many.
    let evidence = "the error spans show a RecursionError raised while resolving a schema reference in every tool call of the run";
    let gain = |weight: f64| {
        let (mut m, tok) = tiny(DType::F32, 37);
        let demos = vec![answer_conversation(&tok, "P16", evidence)];
        let before = decision_logprob(&m, &demos[0]);
        let nll: Vec<f64> = warm_start(&mut m, &demos, 4, weight, false)
            .iter()
            .map(|s| s.nll)
            .collect();
        (decision_logprob(&m, &demos[0]) - before, nll)
    };
    let (plain, plain_nll) = gain(1.0);
    let (weighted, weighted_nll) = gain(20.0);
    // The reported loss is the plain NLL whatever the weight: both start at the same value.
    assert!(
        (plain_nll[0] - weighted_nll[0]).abs() < 1e-6,
        "{plain_nll:?} {weighted_nll:?}"
    );
    assert!(
        weighted > plain && weighted > 0.0,
        "answer log-probability gain: weight 1 {plain}, weight 20 {weighted}"
    );
}
