//! Device memory planning: sizes in words, a plan of named allocations checked against the free
//! memory with a clear "will not fit" error, and the message for an allocation the driver refused.

use crate::engine::error::{EngineError, Result};

/// Bytes as a short human string (`1.5 GiB`, `12.0 MiB`, `512 B`).
pub fn human(bytes: usize) -> String {
    const K: f64 = 1024.0;
    let b = bytes as f64;
    if b >= K * K * K {
        format!("{:.1} GiB", b / (K * K * K))
    } else if b >= K * K {
        format!("{:.1} MiB", b / (K * K))
    } else if b >= K {
        format!("{:.1} KiB", b / K)
    } else {
        format!("{bytes} B")
    }
}

/// A list of named allocations to make together.
#[derive(Clone, Debug, Default)]
pub struct MemoryPlan {
    entries: Vec<(String, usize)>,
}

impl MemoryPlan {
    /// An empty plan.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an allocation of `bytes` called `what`.
    pub fn add(&mut self, what: impl Into<String>, bytes: usize) -> &mut Self {
        self.entries.push((what.into(), bytes));
        self
    }

    /// Total bytes.
    pub fn total(&self) -> usize {
        self.entries.iter().map(|e| e.1).sum()
    }

    /// Checks the plan against `free` of `total` bytes of device memory, keeping `reserve`
    /// bytes for the driver, cuBLAS workspaces and fragmentation.
    pub fn check(&self, free: usize, total: usize, reserve: usize) -> Result<()> {
        let need = self.total();
        if need.saturating_add(reserve) <= free {
            return Ok(());
        }
        let mut biggest = self.entries.clone();
        biggest.sort_by_key(|b| std::cmp::Reverse(b.1));
        let parts: Vec<String> = biggest
            .iter()
            .take(3)
            .map(|(w, b)| format!("{w} {}", human(*b)))
            .collect();
        Err(EngineError::Device(format!(
            "will not fit: needs {} ({}) plus {} reserve, but only {} of {} is free on the GPU",
            human(need),
            parts.join(", "),
            human(reserve),
            human(free),
            human(total)
        )))
    }
}

/// The error of an allocation the driver refused, with the memory situation.
pub fn alloc_error(bytes: usize, free_total: Option<(usize, usize)>, cause: &str) -> EngineError {
    match free_total {
        Some((free, total)) => EngineError::Device(format!(
            "will not fit: allocating {} failed ({cause}); {} of {} is free on the GPU",
            human(bytes),
            human(free),
            human(total)
        )),
        None => EngineError::Device(format!(
            "allocating {} on the GPU failed: {cause}",
            human(bytes)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(3 << 20), "3.0 MiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }

    #[test]
    fn a_plan_that_fits_passes_and_one_that_does_not_names_the_biggest_parts() {
        let mut p = MemoryPlan::new();
        p.add("weights", 10 << 30)
            .add("kv cache", 20 << 30)
            .add("activations", 1 << 30);
        assert_eq!(p.total(), 31 << 30);
        assert!(p.check(40 << 30, 80 << 30, 1 << 30).is_ok());
        let e = p
            .check(24 << 30, 80 << 30, 1 << 30)
            .unwrap_err()
            .to_string();
        assert!(e.contains("will not fit"), "{e}");
        assert!(e.contains("kv cache 20.0 GiB, weights 10.0 GiB"), "{e}");
        assert!(e.contains("24.0 GiB of 80.0 GiB is free"), "{e}");
    }

    #[test]
    fn refused_allocations_say_how_much_was_free() {
        let e = alloc_error(
            2 << 30,
            Some((1 << 30, 80 << 30)),
            "CUDA_ERROR_OUT_OF_MEMORY",
        );
        assert!(e
            .to_string()
            .contains("will not fit: allocating 2.0 GiB failed"));
        let e = alloc_error(1, None, "x").to_string();
        assert!(e.contains("allocating 1 B on the GPU failed: x"));
    }
}
