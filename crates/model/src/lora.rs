//! LoRA adapters: configuration, parameters, and the PEFT on-disk format
//! (`adapter_config.json` + `adapter_model.safetensors`) so adapters move between this crate,
//! PEFT and vLLM unchanged.

use crate::error::{ModelError, Result};
use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// A linear projection inside a decoder block that LoRA can adapt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Projection {
    #[serde(rename = "q_proj")]
    Q,
    #[serde(rename = "k_proj")]
    K,
    #[serde(rename = "v_proj")]
    V,
    #[serde(rename = "o_proj")]
    O,
    #[serde(rename = "gate_proj")]
    Gate,
    #[serde(rename = "up_proj")]
    Up,
    #[serde(rename = "down_proj")]
    Down,
}

impl Projection {
    /// All seven projections, in block order.
    pub const ALL: [Projection; 7] = [
        Projection::Q,
        Projection::K,
        Projection::V,
        Projection::O,
        Projection::Gate,
        Projection::Up,
        Projection::Down,
    ];

    /// The module name PEFT uses in `target_modules` (`q_proj`, ...).
    pub fn peft_name(self) -> &'static str {
        match self {
            Projection::Q => "q_proj",
            Projection::K => "k_proj",
            Projection::V => "v_proj",
            Projection::O => "o_proj",
            Projection::Gate => "gate_proj",
            Projection::Up => "up_proj",
            Projection::Down => "down_proj",
        }
    }

    /// Path of the module inside a Hugging Face decoder layer (`self_attn.q_proj`, ...).
    pub fn module_path(self) -> &'static str {
        match self {
            Projection::Q => "self_attn.q_proj",
            Projection::K => "self_attn.k_proj",
            Projection::V => "self_attn.v_proj",
            Projection::O => "self_attn.o_proj",
            Projection::Gate => "mlp.gate_proj",
            Projection::Up => "mlp.up_proj",
            Projection::Down => "mlp.down_proj",
        }
    }

    /// Parses a PEFT module name.
    pub fn from_peft_name(name: &str) -> Option<Self> {
        Projection::ALL.into_iter().find(|p| p.peft_name() == name)
    }
}

/// Hyper-parameters of one adapter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    /// Rank `r` of the update `B·A`.
    pub rank: usize,
    /// `lora_alpha`; the update is scaled by `alpha / rank` (or `alpha / sqrt(rank)` with rsLoRA).
    pub alpha: f64,
    /// Dropout probability on the adapter's input, applied only in training mode.
    pub dropout: f64,
    /// Which projections get an adapter.
    pub target_modules: Vec<Projection>,
    /// Rank-stabilised scaling (`use_rslora` in PEFT).
    pub use_rslora: bool,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            rank: 8,
            alpha: 16.0,
            dropout: 0.0,
            target_modules: Projection::ALL.to_vec(),
            use_rslora: false,
        }
    }
}

impl LoraConfig {
    /// Multiplier applied to `B·A·x`.
    pub fn scale(&self) -> f64 {
        if self.use_rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }

    fn validate(&self, name: &str) -> Result<()> {
        if self.rank == 0 {
            return Err(ModelError::adapter(name, "rank must be positive"));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(ModelError::adapter(name, "dropout must be in [0, 1)"));
        }
        if self.target_modules.is_empty() {
            return Err(ModelError::adapter(name, "target_modules is empty"));
        }
        Ok(())
    }
}

/// The two trainable factors of one adapted projection: `A` is `(rank, in)`, `B` is `(out, rank)`.
/// Kept in f32 for f32 and bf16 models (f64 for f64 models), so optimizer updates are not lost
/// to rounding.
#[derive(Debug, Clone)]
pub struct LoraPair {
    pub a: Var,
    pub b: Var,
}

/// A scalar value head `v = w·h + b` on the last hidden state, for PPO's critic.
#[derive(Debug, Clone)]
pub struct ValueHead {
    /// `(1, hidden)`, in the parameter dtype (f32, or f64 for f64 models).
    pub weight: Var,
    /// `(1,)`, in the parameter dtype.
    pub bias: Var,
}

/// Names TRL uses for its value head, so the file is recognisable elsewhere.
const VALUE_HEAD_WEIGHT: &str = "v_head.summary.weight";
const VALUE_HEAD_BIAS: &str = "v_head.summary.bias";
/// File holding the value head next to the PEFT files (PEFT itself ignores it).
pub const VALUE_HEAD_FILE: &str = "value_head.safetensors";

/// One named set of LoRA factors (plus an optional value head) over a shared frozen base.
#[derive(Debug, Clone)]
pub struct Adapter {
    pub config: LoraConfig,
    pub(crate) pairs: BTreeMap<(usize, Projection), LoraPair>,
    pub(crate) value_head: Option<ValueHead>,
}

/// Input and output sizes of each projection, per layer, as the base model has them.
pub(crate) type ProjectionShapes = HashMap<Projection, (usize, usize)>;

impl Adapter {
    /// A fresh adapter with PEFT's default initialisation: `A` Kaiming-uniform
    /// (bound `1/sqrt(in)`), `B` zero, so the adapted model starts equal to the base.
    pub(crate) fn init(
        name: &str,
        config: LoraConfig,
        num_layers: usize,
        shapes: &ProjectionShapes,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        config.validate(name)?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut pairs = BTreeMap::new();
        for layer in 0..num_layers {
            for &proj in &config.target_modules {
                let (inp, out) = shapes[&proj];
                let bound = 1.0 / (inp as f32).sqrt();
                let a: Vec<f32> = (0..config.rank * inp)
                    .map(|_| rng.random_range(-bound..bound))
                    .collect();
                let a = Tensor::from_vec(a, (config.rank, inp), device)?.to_dtype(dtype)?;
                let a = Var::from_tensor(&a)?;
                let b = Var::zeros((out, config.rank), dtype, device)?;
                pairs.insert((layer, proj), LoraPair { a, b });
            }
        }
        Ok(Adapter {
            config,
            pairs,
            value_head: None,
        })
    }

    /// The factors of one adapted projection, if this adapter targets it.
    pub fn pair(&self, layer: usize, proj: Projection) -> Option<&LoraPair> {
        self.pairs.get(&(layer, proj))
    }

    /// Every adapted projection with its factors, in (layer, projection) order.
    pub fn pairs(&self) -> impl Iterator<Item = (&(usize, Projection), &LoraPair)> {
        self.pairs.iter()
    }

    /// The value head, when one was added.
    pub fn value_head(&self) -> Option<&ValueHead> {
        self.value_head.as_ref()
    }

    /// All trainable parameters: LoRA factors in (layer, projection, A, B) order, then the value
    /// head's weight and bias. The base model is never included.
    pub fn trainable_vars(&self) -> Vec<Var> {
        let mut vars: Vec<Var> = self
            .pairs
            .values()
            .flat_map(|p| [p.a.clone(), p.b.clone()])
            .collect();
        if let Some(vh) = &self.value_head {
            vars.push(vh.weight.clone());
            vars.push(vh.bias.clone());
        }
        vars
    }

    pub(crate) fn add_value_head(
        &mut self,
        hidden: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<()> {
        // Zero init: the critic starts predicting 0 and learns from the returns.
        self.value_head = Some(ValueHead {
            weight: Var::zeros((1, hidden), dtype, device)?,
            bias: Var::zeros(1, dtype, device)?,
        });
        Ok(())
    }

    /// Writes the adapter in PEFT's format into `dir` (created if needed): `adapter_config.json`
    /// and `adapter_model.safetensors`, plus `value_head.safetensors` when a value head exists.
    /// Each file is written to a temporary name and renamed, so a crash leaves no half file.
    pub fn save_peft(&self, dir: &Path, base_model_name: &str) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
        let targets: Vec<&str> = self
            .config
            .target_modules
            .iter()
            .map(|p| p.peft_name())
            .collect();
        let config = serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base_model_name,
            "r": self.config.rank,
            "lora_alpha": self.config.alpha,
            "lora_dropout": self.config.dropout,
            "target_modules": targets,
            "use_rslora": self.config.use_rslora,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "modules_to_save": null,
            "layers_to_transform": null,
            "rank_pattern": {},
            "alpha_pattern": {},
            "use_dora": false,
        });
        let text = serde_json::to_string_pretty(&config).expect("json value serialises");
        write_atomically(&dir.join("adapter_config.json"), |tmp| {
            std::fs::write(tmp, text.as_bytes()).map_err(|e| ModelError::io(tmp, e))
        })?;
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        for ((layer, proj), pair) in &self.pairs {
            let prefix = format!(
                "base_model.model.model.layers.{layer}.{}",
                proj.module_path()
            );
            tensors.insert(
                format!("{prefix}.lora_A.weight"),
                pair.a.as_tensor().detach(),
            );
            tensors.insert(
                format!("{prefix}.lora_B.weight"),
                pair.b.as_tensor().detach(),
            );
        }
        write_atomically(&dir.join("adapter_model.safetensors"), |tmp| {
            candle_core::safetensors::save(&tensors, tmp).map_err(ModelError::from)
        })?;
        if let Some(vh) = &self.value_head {
            let vt: HashMap<String, Tensor> = [
                (
                    VALUE_HEAD_WEIGHT.to_string(),
                    vh.weight.as_tensor().detach(),
                ),
                (VALUE_HEAD_BIAS.to_string(), vh.bias.as_tensor().detach()),
            ]
            .into();
            write_atomically(&dir.join(VALUE_HEAD_FILE), |tmp| {
                candle_core::safetensors::save(&vt, tmp).map_err(ModelError::from)
            })?;
        }
        Ok(())
    }

    /// Reads a PEFT LoRA adapter directory. `shapes` gives each projection's (in, out) so
    /// mismatched adapters are rejected with the offending tensor named.
    pub(crate) fn load_peft(
        name: &str,
        dir: &Path,
        num_layers: usize,
        shapes: &ProjectionShapes,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let cfg_path = dir.join("adapter_config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::io(&cfg_path, e))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| ModelError::Json {
            path: cfg_path.clone(),
            source: e,
        })?;
        let config = parse_peft_config(&cfg_path.display().to_string(), &json)?;
        config.validate(name)?;
        let st_path = dir.join("adapter_model.safetensors");
        if !st_path.exists() {
            return Err(ModelError::io(
                &st_path,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "missing (only the safetensors format is supported, not adapter_model.bin)",
                ),
            ));
        }
        let origin = st_path.display().to_string();
        let raw = candle_core::safetensors::load(&st_path, device)?;
        let mut found: HashMap<(usize, Projection, char), Tensor> = HashMap::new();
        for (tname, tensor) in raw {
            let key = parse_peft_tensor_name(&tname).ok_or_else(|| {
                ModelError::weight(
                    &origin,
                    &tname,
                    "not a LoRA factor of a supported projection (expected \
                     base_model.model.model.layers.N.<self_attn|mlp>.<proj>.lora_<A|B>.weight)",
                )
            })?;
            if key.0 >= num_layers {
                return Err(ModelError::weight(
                    &origin,
                    &tname,
                    format!("layer {} but the model has {num_layers} layers", key.0),
                ));
            }
            if !config.target_modules.contains(&key.1) {
                return Err(ModelError::weight(
                    &origin,
                    &tname,
                    "projection not listed in target_modules",
                ));
            }
            found.insert(key, tensor.to_dtype(dtype)?);
        }
        let mut pairs = BTreeMap::new();
        for layer in 0..num_layers {
            for &proj in &config.target_modules {
                let (inp, out) = shapes[&proj];
                let tname = |ab: char| {
                    format!(
                        "base_model.model.model.layers.{layer}.{}.lora_{ab}.weight",
                        proj.module_path()
                    )
                };
                let a = found
                    .remove(&(layer, proj, 'A'))
                    .ok_or_else(|| ModelError::weight(&origin, tname('A'), "missing"))?;
                let b = found
                    .remove(&(layer, proj, 'B'))
                    .ok_or_else(|| ModelError::weight(&origin, tname('B'), "missing"))?;
                if a.dims() != [config.rank, inp] {
                    return Err(ModelError::weight(
                        &origin,
                        tname('A'),
                        format!("shape {:?}, expected [{}, {inp}]", a.dims(), config.rank),
                    ));
                }
                if b.dims() != [out, config.rank] {
                    return Err(ModelError::weight(
                        &origin,
                        tname('B'),
                        format!("shape {:?}, expected [{out}, {}]", b.dims(), config.rank),
                    ));
                }
                pairs.insert(
                    (layer, proj),
                    LoraPair {
                        a: Var::from_tensor(&a)?,
                        b: Var::from_tensor(&b)?,
                    },
                );
            }
        }
        let vh_path = dir.join(VALUE_HEAD_FILE);
        let value_head = if vh_path.exists() {
            let vh_origin = vh_path.display().to_string();
            let mut t = candle_core::safetensors::load(&vh_path, device)?;
            let mut take = |n: &str| {
                t.remove(n)
                    .ok_or_else(|| ModelError::weight(&vh_origin, n, "missing"))
                    .and_then(|t| Ok(t.to_dtype(dtype)?))
            };
            let weight = take(VALUE_HEAD_WEIGHT)?;
            let bias = take(VALUE_HEAD_BIAS)?;
            let (hidden, _) = shapes[&Projection::Q];
            if weight.dims() != [1, hidden] || bias.dims() != [1] {
                return Err(ModelError::weight(
                    &vh_origin,
                    VALUE_HEAD_WEIGHT,
                    format!("expected weight [1, {hidden}] and bias [1]"),
                ));
            }
            Some(ValueHead {
                weight: Var::from_tensor(&weight)?,
                bias: Var::from_tensor(&bias)?,
            })
        } else {
            None
        };
        Ok(Adapter {
            config,
            pairs,
            value_head,
        })
    }
}

/// Reads the parts of a PEFT `adapter_config.json` this crate understands, refusing the
/// features it does not implement rather than silently ignoring them.
fn parse_peft_config(origin: &str, json: &Value) -> Result<LoraConfig> {
    let get = |k: &str| json.get(k).filter(|v| !v.is_null());
    if let Some(t) = get("peft_type").and_then(Value::as_str) {
        if t != "LORA" {
            return Err(ModelError::config(
                origin,
                "peft_type",
                format!("`{t}` is not LORA"),
            ));
        }
    }
    let rank = get("r")
        .and_then(Value::as_u64)
        .ok_or_else(|| ModelError::config(origin, "r", "missing or not an integer"))?
        as usize;
    let alpha = get("lora_alpha")
        .and_then(Value::as_f64)
        .unwrap_or(rank as f64);
    let dropout = get("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0);
    let use_rslora = get("use_rslora").and_then(Value::as_bool).unwrap_or(false);
    let target_modules = match get("target_modules") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                let s = v.as_str().unwrap_or("");
                Projection::from_peft_name(s).ok_or_else(|| {
                    ModelError::config(
                        origin,
                        "target_modules",
                        format!("unsupported module `{s}` (supported: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)"),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?,
        Some(Value::String(s)) if s == "all-linear" => Projection::ALL.to_vec(),
        _ => {
            return Err(ModelError::config(
                origin,
                "target_modules",
                "expected a list of module names (regular expressions are not supported)",
            ))
        }
    };
    if get("fan_in_fan_out").and_then(Value::as_bool) == Some(true) {
        return Err(ModelError::config(
            origin,
            "fan_in_fan_out",
            "true is not supported",
        ));
    }
    if let Some(b) = get("bias").and_then(Value::as_str) {
        if b != "none" {
            return Err(ModelError::config(
                origin,
                "bias",
                format!("`{b}` is not supported (only none)"),
            ));
        }
    }
    for unsupported in ["layers_to_transform", "modules_to_save"] {
        if get(unsupported).is_some() {
            return Err(ModelError::config(origin, unsupported, "not supported"));
        }
    }
    for pattern in ["rank_pattern", "alpha_pattern"] {
        if let Some(Value::Object(m)) = get(pattern) {
            if !m.is_empty() {
                return Err(ModelError::config(
                    origin,
                    pattern,
                    "per-module patterns are not supported",
                ));
            }
        }
    }
    if get("use_dora").and_then(Value::as_bool) == Some(true) {
        return Err(ModelError::config(
            origin,
            "use_dora",
            "DoRA is not supported",
        ));
    }
    Ok(LoraConfig {
        rank,
        alpha,
        dropout,
        target_modules,
        use_rslora,
    })
}

/// `base_model.model.model.layers.3.self_attn.q_proj.lora_A[.default].weight` → (3, Q, 'A').
fn parse_peft_tensor_name(name: &str) -> Option<(usize, Projection, char)> {
    let rest = name.strip_prefix("base_model.model.model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (group, rest) = rest.split_once('.')?;
    if group != "self_attn" && group != "mlp" {
        return None;
    }
    let (proj, rest) = rest.split_once('.')?;
    let proj = Projection::from_peft_name(proj)?;
    if proj.module_path().split_once('.')?.0 != group {
        return None;
    }
    let rest = rest.strip_suffix(".weight")?;
    let ab = rest.split('.').next()?;
    let ab = match ab {
        "lora_A" => 'A',
        "lora_B" => 'B',
        _ => return None,
    };
    Some((layer, proj, ab))
}

/// Writes `path` via a sibling temporary file and a rename.
pub(crate) fn write_atomically(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{file_name}.tmp-{}", std::process::id()));
    let result = write(&tmp);
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return result;
    }
    std::fs::rename(&tmp, path).map_err(|e| ModelError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_peft_tensor_names() {
        assert_eq!(
            parse_peft_tensor_name("base_model.model.model.layers.12.mlp.down_proj.lora_B.weight"),
            Some((12, Projection::Down, 'B'))
        );
        assert_eq!(
            parse_peft_tensor_name(
                "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
            ),
            Some((0, Projection::Q, 'A'))
        );
        assert_eq!(
            parse_peft_tensor_name("base_model.model.model.layers.0.mlp.q_proj.lora_A.weight"),
            None
        );
        assert_eq!(parse_peft_tensor_name("model.embed_tokens.weight"), None);
    }

    #[test]
    fn rejects_unsupported_peft_features_by_field() {
        let json = serde_json::json!({"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"], "use_dora": true});
        let err = parse_peft_config("a.json", &json).unwrap_err().to_string();
        assert!(err.contains("use_dora"), "{err}");
        let json = serde_json::json!({"r": 4, "target_modules": ["lm_head"]});
        let err = parse_peft_config("a.json", &json).unwrap_err().to_string();
        assert!(err.contains("lm_head"), "{err}");
        let json =
            serde_json::json!({"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "down_proj"]});
        let cfg = parse_peft_config("a.json", &json).unwrap();
        assert_eq!(cfg.scale(), 2.0);
        assert_eq!(cfg.target_modules, vec![Projection::Q, Projection::Down]);
    }
}
