//! AdamW with fp32 moments (and fp32 master weights for weights stored in bf16), global-norm
//! gradient clipping, and a cosine learning-rate schedule with linear warmup.

use std::collections::BTreeMap;
use std::path::Path;

use crate::engine::backend::AdamWParams;
use crate::engine::{Backend, DType, Tensor};
use crate::model::st_writer::StreamTensor;
use crate::model::weights::HostTensor;
use crate::model::weights::WeightFiles;
use crate::train::error::{Result, TrainError};
use crate::train::params::Grads;

/// Optimizer and schedule settings.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OptimConfig {
    /// Peak learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Adam epsilon.
    pub eps: f32,
    /// Decoupled weight decay (not applied to 1-D parameters: norms and biases).
    pub weight_decay: f32,
    /// Clip the global gradient norm to this value (0 disables clipping).
    pub max_grad_norm: f32,
    /// Linear warmup steps.
    pub warmup_steps: u64,
    /// Total optimizer steps (the cosine reaches `min_lr_ratio * lr` there).
    pub total_steps: u64,
    /// Final learning rate as a fraction of the peak.
    pub min_lr_ratio: f32,
}

impl Default for OptimConfig {
    fn default() -> Self {
        Self {
            lr: 1e-4,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            warmup_steps: 0,
            total_steps: 1,
            min_lr_ratio: 0.1,
        }
    }
}

/// The learning rate of 0-based optimizer step `step`: linear warmup to the peak over
/// `warmup_steps`, then a cosine decay to `min_lr_ratio * lr` at `total_steps`.
pub fn lr_at(c: &OptimConfig, step: u64) -> f32 {
    if step < c.warmup_steps {
        return c.lr * (step + 1) as f32 / c.warmup_steps as f32;
    }
    let decay = c.total_steps.saturating_sub(c.warmup_steps).max(1);
    let p = ((step - c.warmup_steps) as f64 / decay as f64).min(1.0);
    let cos = 0.5 * (1.0 + (std::f64::consts::PI * p).cos());
    let min = c.min_lr_ratio as f64;
    (c.lr as f64 * (min + (1.0 - min) * cos)) as f32
}

/// What one optimizer step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepStats {
    /// Learning rate used.
    pub lr: f32,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Whether the gradients were clipped.
    pub clipped: bool,
}

/// AdamW state: fp32 first and second moments per trained parameter, an fp32 master copy of each
/// parameter stored in a narrower dtype (bf16 on a GPU: updates below 2^-9 of a weight would be
/// lost if written straight into it), and the step count.
pub struct AdamW<B: Backend> {
    /// Settings.
    pub config: OptimConfig,
    /// Optimizer steps taken.
    pub step: u64,
    /// Parameter names, in order.
    pub names: Vec<String>,
    /// First moments.
    pub m: Vec<Tensor<B>>,
    /// Second moments.
    pub v: Vec<Tensor<B>>,
    /// fp32 master weights, where the parameter's own dtype is narrower (see
    /// [`Backend::master_copy`]). Checkpointed as `master.<param>`, so a resumed run continues
    /// from the exact fp32 weights, not from their rounded copy.
    pub master: Vec<Option<Tensor<B>>>,
}

impl<B: Backend> AdamW<B> {
    /// Zero moments for the given parameters.
    pub fn new(be: &B, config: OptimConfig, params: &[(String, &Tensor<B>)]) -> Result<Self> {
        let mut m = Vec::with_capacity(params.len());
        let mut v = Vec::with_capacity(params.len());
        let mut master = Vec::with_capacity(params.len());
        for (_, p) in params {
            m.push(be.zeros(p.shape(), DType::F32)?);
            v.push(be.zeros(p.shape(), DType::F32)?);
            master.push(be.master_copy(p)?);
        }
        Ok(Self {
            config,
            step: 0,
            names: params.iter().map(|(n, _)| n.clone()).collect(),
            m,
            v,
            master,
        })
    }

    /// Clips the gradients to the global norm and applies one AdamW update to `params` (which
    /// must be in the order of `grads`) at the learning rate of the schedule.
    pub fn step(
        &mut self,
        be: &B,
        params: Vec<(String, &mut Tensor<B>)>,
        grads: &mut Grads<B>,
    ) -> Result<StepStats> {
        let lr = lr_at(&self.config, self.step);
        self.step_with_lr(be, params, grads.named_mut(), lr)
    }

    /// As [`AdamW::step`] with an explicit learning rate and named gradient tensors.
    pub fn step_with_lr(
        &mut self,
        be: &B,
        params: Vec<(String, &mut Tensor<B>)>,
        mut grads: Vec<(String, &mut Tensor<B>)>,
        lr: f32,
    ) -> Result<StepStats> {
        if grads.len() != params.len() || params.len() != self.names.len() {
            return Err(TrainError::Input(format!(
                "{} parameters, {} gradients, {} optimizer slots",
                params.len(),
                grads.len(),
                self.names.len()
            )));
        }
        let all: Vec<&Tensor<B>> = grads.iter().map(|(_, g)| &**g).collect();
        let grad_norm = be.sum_squares_all(&all)?.sqrt();
        if !grad_norm.is_finite() {
            return Err(TrainError::Input(format!(
                "gradient norm is {grad_norm} at step {}",
                self.step + 1
            )));
        }
        let max = self.config.max_grad_norm as f64;
        let clipped = max > 0.0 && grad_norm > max;
        if clipped {
            let c = (max / (grad_norm + 1e-6)) as f32;
            for (_, g) in grads.iter_mut() {
                be.scale(g, c)?;
            }
        }
        self.step += 1;
        for (i, ((name, p), (gname, g))) in params.into_iter().zip(grads).enumerate() {
            if name != gname || name != self.names[i] {
                return Err(TrainError::Input(format!(
                    "parameter {name} does not match gradient {gname}"
                )));
            }
            let wd = if p.shape().len() > 1 {
                self.config.weight_decay
            } else {
                0.0
            };
            let hp = AdamWParams {
                lr,
                beta1: self.config.beta1,
                beta2: self.config.beta2,
                eps: self.config.eps,
                weight_decay: wd,
                step: self.step,
            };
            match &mut self.master[i] {
                Some(w) => be.adamw_step_master(p, w, g, &mut self.m[i], &mut self.v[i], hp)?,
                None => be.adamw_step(p, g, &mut self.m[i], &mut self.v[i], hp)?,
            }
        }
        Ok(StepStats {
            lr,
            grad_norm,
            clipped,
        })
    }
}

impl<B: Backend> AdamW<B> {
    /// The f32 state tensors of parameter `i`: its moments, and its master copy where it has one.
    fn slot_state(&self, i: usize) -> Vec<(&'static str, &Tensor<B>)> {
        let mut out = vec![("m", &self.m[i]), ("v", &self.v[i])];
        if let Some(w) = &self.master[i] {
            out.push(("master", w));
        }
        out
    }

    /// The optimizer state as host tensors named `m.<param>`, `v.<param>` and, for parameters
    /// with an fp32 master copy, `master.<param>` (for checkpoints).
    pub fn state_tensors(&self, be: &B) -> Result<BTreeMap<String, HostTensor>> {
        let mut out = BTreeMap::new();
        for (i, name) in self.names.iter().enumerate() {
            for (kind, t) in self.slot_state(i) {
                out.insert(
                    format!("{kind}.{name}"),
                    HostTensor::f32(t.shape(), &be.to_host_f32(t)?),
                );
            }
        }
        Ok(out)
    }

    /// The state as streamed safetensors entries named as in [`AdamW::state_tensors`] (no host
    /// copy of the whole state; a checkpoint writes them one at a time).
    pub fn state_stream<'a>(&'a self, be: &'a B) -> Vec<StreamTensor<'a>> {
        let mut out = Vec::with_capacity(3 * self.names.len());
        for (i, name) in self.names.iter().enumerate() {
            for (kind, t) in self.slot_state(i) {
                out.push(StreamTensor::from_backend(be, format!("{kind}.{name}"), t));
            }
        }
        out
    }

    /// Loads the state written by [`AdamW::state_tensors`] from a safetensors file, memory-mapped
    /// one tensor at a time, as exact f32 (never narrowed to a bf16 compute dtype). A checkpoint
    /// without master weights (older runs) keeps the master copies made from the weights. A
    /// missing moment or a wrong shape is an error naming the file and the tensor.
    pub fn load_state(&mut self, be: &B, path: &Path) -> Result<()> {
        let files = WeightFiles::open_file(path)?;
        let exact = |key: &str, shape: &[usize]| -> Result<Tensor<B>> {
            let host = files.host_f32(key, shape)?;
            Ok(be.upload_f32_exact(&host, shape)?)
        };
        for i in 0..self.names.len() {
            let name = &self.names[i];
            self.m[i] = exact(&format!("m.{name}"), self.m[i].shape())?;
            self.v[i] = exact(&format!("v.{name}"), self.v[i].shape())?;
            let key = format!("master.{name}");
            if let Some(w) = &mut self.master[i] {
                if files.contains(&key) {
                    *w = exact(&key, w.shape())?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Cpu, HostData};

    #[test]
    fn the_global_norm_is_one_reduction_equal_to_the_per_tensor_sums() {
        let a = Cpu.upload(HostData::F32(&[3.0, 4.0]), &[2]).unwrap();
        let b = Cpu.upload(HostData::F32(&[12.0]), &[1]).unwrap();
        let all = Cpu.sum_squares_all(&[&a, &b]).unwrap();
        assert_eq!(all, 169.0);
        assert_eq!(Cpu.sum_squares_all(&[]).unwrap(), 0.0);
    }

    #[test]
    fn f32_weights_need_no_master_and_the_default_master_step_equals_the_plain_one() {
        let w0 = [1.0f32, -2.0, 0.5];
        let p = Cpu.upload(HostData::F32(&w0), &[3]).unwrap();
        assert!(Cpu.master_copy(&p).unwrap().is_none());
        let opt = AdamW::new(&Cpu, OptimConfig::default(), &[("p".into(), &p)]).unwrap();
        assert!(opt.master.iter().all(Option::is_none));
        let hp = AdamWParams {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            step: 1,
        };
        let g = Cpu.upload(HostData::F32(&[0.5, -1.0, 2.0]), &[3]).unwrap();
        let z = || Cpu.zeros(&[3], DType::F32).unwrap();
        let (mut plain, mut m1, mut v1) = (Cpu.copy(&p).unwrap(), z(), z());
        Cpu.adamw_step(&mut plain, &g, &mut m1, &mut v1, hp)
            .unwrap();
        let (mut param, mut master, mut m2, mut v2) = (z(), Cpu.copy(&p).unwrap(), z(), z());
        Cpu.adamw_step_master(&mut param, &mut master, &g, &mut m2, &mut v2, hp)
            .unwrap();
        let want = Cpu.to_host_f32(&plain).unwrap();
        assert_eq!(Cpu.to_host_f32(&param).unwrap(), want);
        assert_eq!(Cpu.to_host_f32(&master).unwrap(), want);
        assert_ne!(want, w0.to_vec());
    }

    #[test]
    fn schedule_warms_up_linearly_then_decays_by_cosine_to_the_floor() {
        let c = OptimConfig {
            lr: 1.0,
            warmup_steps: 4,
            total_steps: 14,
            min_lr_ratio: 0.1,
            ..OptimConfig::default()
        };
        let lrs: Vec<f32> = (0..16).map(|s| lr_at(&c, s)).collect();
        assert_eq!(&lrs[..4], &[0.25, 0.5, 0.75, 1.0]);
        assert!((lrs[4] - 1.0).abs() < 1e-6);
        assert!((lrs[9] - 0.55).abs() < 1e-6, "{}", lrs[9]);
        assert!((lrs[14] - 0.1).abs() < 1e-6 && (lrs[15] - 0.1).abs() < 1e-6);
        assert!(lrs[4..15].windows(2).all(|w| w[1] <= w[0]));
    }
}
