//! The memory plan of one RL step on a GPU, per component, before anything is loaded: is there
//! room for the weights, the reference, the trainable state, the rollout's KV cache and the
//! training step's activations?
//!
//! The step has two phases that never hold their buffers at the same time: the rollout (KV cache
//! and sampler logits) and the update (saved activations, loss-chunk logits, backward
//! temporaries). The peak is the resident state plus the larger phase. Every count is in bytes
//! and follows how the engine stores things: weights in the compute dtype; trainable values
//! (LoRA matrices or, for full fine-tuning, fp32 master weights) with fp32 gradients and two fp32
//! Adam moments; activations in the compute dtype with fp32 attention log-sum-exps; loss logits
//! and their gradient in fp32, `chunk_rows` rows at a time.

use crate::model::config::ModelConfig;

/// Bytes in a GiB.
pub const GIB: f64 = (1u64 << 30) as f64;

/// Room kept free on the GPU for the CUDA context, cuBLAS and fragmentation.
pub const RESERVE_BYTES: u64 = 1 << 30;

/// cuBLAS workspace the engine allows.
pub const CUBLAS_WORKSPACE_BYTES: u64 = 32 << 20;

/// What the plan is for.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanInput {
    /// LoRA rank on all seven projections (0: full fine-tuning, with a reference copy).
    pub lora_rank: usize,
    /// Tokens per sequence (prompt + response).
    pub seq: usize,
    /// Sequences decoded together in the rollout (their KV cache is resident at once).
    pub rollout_seqs: usize,
    /// Sequences in one training forward/backward.
    pub train_seqs: usize,
    /// Bytes per element of the compute dtype (2 for bf16, 4 for f32).
    pub dtype_bytes: usize,
    /// Rows of the loss's logits chunk.
    pub chunk_rows: usize,
    /// Whether blocks are recomputed in backward (only block inputs kept).
    pub recompute: bool,
    /// GPU memory in bytes.
    pub gpu_bytes: u64,
}

/// One line of the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Component {
    /// What it is.
    pub name: &'static str,
    /// Bytes it needs on the GPU.
    pub bytes: u64,
    /// Bytes it needs in host memory when the step runs on the CPU backend (f32; for full
    /// fine-tuning the trained weights are their own master copy).
    pub cpu_bytes: u64,
    /// Whether it is part of the peak (the activation line not chosen is shown, not counted).
    pub counted: bool,
}

/// The memory budget of one RL step.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Every component.
    pub components: Vec<Component>,
    /// Resident state (weights, reference, trainable state, workspace).
    pub resident: u64,
    /// The rollout phase (KV cache, sampler logits).
    pub rollout: u64,
    /// The update phase (activations, loss chunks).
    pub update: u64,
    /// `resident + max(rollout, update)`.
    pub peak: u64,
    /// The same peak in host memory when the step runs on the CPU backend.
    pub cpu_peak: u64,
    /// GPU memory minus [`RESERVE_BYTES`].
    pub usable: u64,
}

/// Trainable values of rank-`r` LoRA adapters on q, k, v, o, gate, up and down of every layer.
pub fn lora_params(c: &ModelConfig, r: usize) -> u64 {
    let (d, q, kv, i) = (
        c.hidden_size,
        c.num_heads * c.head_dim,
        c.num_kv_heads * c.head_dim,
        c.intermediate_size,
    );
    // (out + in) per adapter: q, k, v, o, gate, up, down.
    let per_layer = (q + d) + 2 * (kv + d) + (d + q) + 2 * (i + d) + (d + i);
    (r * per_layer * c.num_layers) as u64
}

/// Values one layer keeps per token for backward: the attention block's input and normed input,
/// q, k, v, the attention output, the MLP block's input and normed input, gate, up and their
/// activated product (in the compute dtype).
pub fn saved_per_token_layer(c: &ModelConfig) -> u64 {
    let (d, q, kv, i) = (
        c.hidden_size,
        c.num_heads * c.head_dim,
        c.num_kv_heads * c.head_dim,
        c.intermediate_size,
    );
    (4 * d + 2 * q + 2 * kv + 3 * i) as u64
}

/// One side's budget: the components' bytes, resident state, rollout and update phases.
struct Budget {
    bytes: Vec<u64>,
    resident: u64,
    rollout: u64,
    update: u64,
}

/// Where the step runs: on a GPU (compute dtype as asked, fp32 master weights beside the
/// weights for full fine-tuning), or on the CPU (f32 throughout; the trained weights are their own
/// master copy, the reference is the mapped base file).
#[derive(Clone, Copy, PartialEq)]
enum Side {
    Gpu,
    Cpu,
}

fn budget(c: &ModelConfig, input: &PlanInput, side: Side) -> Budget {
    let b = match side {
        Side::Gpu => input.dtype_bytes as u64,
        Side::Cpu => 4,
    };
    let p = c.num_params() as u64;
    let (l, d, v) = (
        c.num_layers as u64,
        c.hidden_size as u64,
        c.vocab_size as u64,
    );
    let kv = (c.num_kv_heads * c.head_dim) as u64;
    let heads = c.num_heads as u64;
    let lora = input.lora_rank > 0;
    let trainable = if lora {
        lora_params(c, input.lora_rank) * 16
    } else if side == Side::Cpu {
        p * 12
    } else {
        p * 16
    };
    let train_tokens = (input.seq * input.train_seqs) as u64;
    // Per token: every layer's saved values plus its fp32 log-sum-exp per head, and the
    // final norm's input and output.
    let full_layer_token = saved_per_token_layer(c) * b + heads * 4;
    let act_full = train_tokens * (l * full_layer_token + 2 * d * b);
    let act_recompute = train_tokens * (l * d * b + full_layer_token + 2 * d * b);
    let kv_cache = (input.seq * input.rollout_seqs) as u64 * l * 2 * kv * b;
    let sampler_logits = input.rollout_seqs as u64 * v * 4;
    let loss_chunks = input.chunk_rows.min(input.seq * input.train_seqs) as u64 * v * 4 * 2;
    // One layer's backward temporaries: the MLP's gate/up gradients and the block-input
    // gradient, for every training token.
    let cublas = if side == Side::Gpu {
        CUBLAS_WORKSPACE_BYTES
    } else {
        0
    };
    let workspace = train_tokens * (2 * c.intermediate_size as u64 + d) * b + cublas;
    let reference = if lora { 0 } else { p * b };
    Budget {
        bytes: vec![
            p * b,
            reference,
            trainable,
            act_full,
            act_recompute,
            kv_cache,
            sampler_logits,
            loss_chunks,
            workspace,
        ],
        resident: p * b + reference + trainable + workspace,
        rollout: kv_cache + sampler_logits,
        update: if input.recompute {
            act_recompute
        } else {
            act_full
        } + loss_chunks,
    }
}

impl Plan {
    /// The plan of `input` for model `c`: on the GPU, and (the CPU column) in host memory when
    /// the same step runs on the CPU backend.
    pub fn new(c: &ModelConfig, input: &PlanInput) -> Self {
        let lora = input.lora_rank > 0;
        let gpu = budget(c, input, Side::Gpu);
        let cpu = budget(c, input, Side::Cpu);
        let names: [&'static str; 9] = [
            "weights",
            "reference",
            if lora {
                "LoRA + grads + moments (fp32)"
            } else {
                "master weights + grads + moments (fp32)"
            },
            "activations (no recompute)",
            "activations (recompute)",
            "KV cache (rollout)",
            "sampler logits (rollout)",
            "logits chunks (loss)",
            "workspace",
        ];
        let components = names
            .iter()
            .enumerate()
            .map(|(i, &name)| Component {
                name,
                bytes: gpu.bytes[i],
                cpu_bytes: cpu.bytes[i],
                counted: match i {
                    3 => !input.recompute,
                    4 => input.recompute,
                    _ => true,
                },
            })
            .collect();
        Self {
            components,
            resident: gpu.resident,
            rollout: gpu.rollout,
            update: gpu.update,
            peak: gpu.resident + gpu.rollout.max(gpu.update),
            cpu_peak: cpu.resident + cpu.rollout.max(cpu.update),
            usable: input.gpu_bytes.saturating_sub(RESERVE_BYTES),
        }
    }

    /// Whether the step fits in the usable GPU memory.
    pub fn fits(&self) -> bool {
        self.peak <= self.usable
    }

    /// The plan as a text table (GiB: GPU, and host memory on the CPU backend), with the verdict
    /// on the last line.
    pub fn table(&self) -> String {
        let g = |b: u64| b as f64 / GIB;
        let mut s = format!("{:<52} {:>10} {:>10}\n", "component", "GiB", "CPU GiB");
        for c in &self.components {
            s.push_str(&format!(
                "{:<52} {:>10.2} {:>10.2}{}\n",
                c.name,
                g(c.bytes),
                g(c.cpu_bytes),
                if c.counted { "" } else { "  (not counted)" }
            ));
        }
        s.push_str(&format!(
            "{:<52} {:>10.2}\n{:<52} {:>10.2}\n{:<52} {:>10.2}\n{:<52} {:>10.2} {:>10.2}\n",
            "resident (weights, reference, trainable, workspace)",
            g(self.resident),
            "rollout phase",
            g(self.rollout),
            "update phase",
            g(self.update),
            "peak",
            g(self.peak),
            g(self.cpu_peak)
        ));
        s.push_str(&format!(
            "{}: peak {:.2} GiB of {:.2} GiB usable\n",
            if self.fits() { "fits" } else { "does not fit" },
            g(self.peak),
            g(self.usable)
        ));
        s
    }
}
