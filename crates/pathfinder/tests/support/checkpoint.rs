//! Reading a run's checkpoint files back in tests.

use std::path::Path;

/// Every tensor of a safetensors file as f64 values, sorted by name.
pub fn tensors(path: &Path) -> Vec<(String, Vec<f64>)> {
    let mut t: Vec<(String, Vec<f64>)> =
        candle_core::safetensors::load(path, &candle_core::Device::Cpu)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .into_iter()
            .map(|(k, v)| {
                let v = v.to_dtype(candle_core::DType::F64).unwrap();
                (k, v.flatten_all().unwrap().to_vec1::<f64>().unwrap())
            })
            .collect();
    t.sort_by(|a, b| a.0.cmp(&b.0));
    t
}

/// The files of a token-Detector checkpoint that hold what training changes.
pub const TRAINED_FILES: [&str; 5] = [
    "detector/adapter_model.safetensors",
    "detector/value_head.safetensors",
    "injector/adapter_model.safetensors",
    "optimizer-detector.safetensors",
    "optimizer-injector.safetensors",
];
