//! A framework's frame: the decision head reads a trace relative to its framework's typical
//! trace, so that what every run of a framework shows (its structure, the tools it always
//! repeats, the hand-offs it always makes) is not read as a deficiency.
//!
//! Each framework shapes its traces: one agent re-runs a tool with the same arguments three
//! times in every healthy run, another hands off between agents in every run. A head fitted
//! on raw inputs learns that such lines mean "deficient" when its training frameworks only
//! show them in deficient runs, and then calls every healthy run of the new framework
//! deficient (leave one framework out over six frameworks: all 12 healthy swe runs,
//! BENCHMARKS.md). A frame is the per-input median over a set of the framework's traces; the
//! head is fitted on each training framework's inputs minus that framework's frame, and reads
//! a new framework's traces minus its own.
//!
//! Why the median: a deficiency type changes a few inputs of the traces it is planted in, and
//! no one type makes up most of a framework's traces, so on each input most traces read as
//! that framework's healthy runs do. The median of any reasonable mix — the framework's train
//! traces (mostly deficient, many types), a user's store (mostly healthy), or a handful of
//! healthy runs — lands near the healthy value, which is what the head should read from.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{PolicyError, Result};

/// The typical head input of one framework's traces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    /// Which traces it was taken over (a framework, "its 131 traces", a user's runs), shown
    /// wherever it is used.
    pub name: String,
    /// How many traces the median was taken over.
    pub traces: usize,
    /// The per-input median, subtracted from every input the head reads under this frame.
    pub centre: Vec<f32>,
}

impl Frame {
    /// The frame of `rows` (head inputs of one framework's traces, all of one length).
    pub fn median_of(name: &str, rows: &[&[f32]]) -> Result<Frame> {
        let Some(first) = rows.first() else {
            return Err(PolicyError::Calibration(format!(
                "frame `{name}`: no traces to take a framework's typical input over"
            )));
        };
        let dim = first.len();
        if let Some((i, r)) = rows.iter().enumerate().find(|(_, r)| r.len() != dim) {
            return Err(PolicyError::Calibration(format!(
                "frame `{name}`: trace {i} has {} inputs, the first {dim}",
                r.len()
            )));
        }
        let mut column = vec![0f32; rows.len()];
        let centre = (0..dim)
            .map(|j| {
                column.iter_mut().zip(rows).for_each(|(c, r)| *c = r[j]);
                median(&mut column)
            })
            .collect();
        Ok(Frame {
            name: name.to_owned(),
            traces: rows.len(),
            centre,
        })
    }

    /// `x` as the head reads it under this frame.
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        x.iter().zip(&self.centre).map(|(a, c)| a - c).collect()
    }
}

/// The frame of `framework` among a framed head's training `frames`: its own when the head
/// was fitted on it, else the per-input median of all of them (the best guess without a run of
/// the framework). None when there are no frames (a head fitted on raw inputs).
pub fn for_framework(frames: &BTreeMap<String, Frame>, framework: Option<&str>) -> Option<Frame> {
    if let Some(f) = framework.and_then(|name| frames.get(name)) {
        return Some(f.clone());
    }
    let centres: Vec<&[f32]> = frames.values().map(|f| f.centre.as_slice()).collect();
    let name = format!(
        "the median of {} training frameworks' frames",
        centres.len()
    );
    Frame::median_of(&name, &centres).ok()
}

/// The median of `v` (the mean of the two middle values for an even count); `v` is reordered.
fn median(v: &mut [f32]) -> f32 {
    v.sort_by(f32::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_the_per_input_median_and_ignores_a_minority_of_outliers() {
        let rows: Vec<Vec<f32>> = vec![
            vec![1.0, 0.0],
            vec![1.0, 0.0],
            vec![1.0, 5.0],
            vec![9.0, 0.0],
        ];
        let refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        let f = Frame::median_of("fw", &refs).unwrap();
        assert_eq!(f.centre, vec![1.0, 0.0]);
        assert_eq!(f.traces, 4);
        assert_eq!(f.apply(&[3.0, 5.0]), vec![2.0, 5.0]);
        let odd = Frame::median_of("fw", &refs[..3]).unwrap();
        assert_eq!(odd.centre, vec![1.0, 0.0]);
    }

    #[test]
    fn a_frame_needs_traces_of_one_width() {
        assert!(Frame::median_of("fw", &[]).is_err());
        let err = Frame::median_of("fw", &[&[1.0, 2.0][..], &[1.0][..]])
            .unwrap_err()
            .to_string();
        assert!(err.contains("trace 1 has 1 inputs"), "{err}");
    }
}
