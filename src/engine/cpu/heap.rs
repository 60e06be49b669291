//! Keeps freed activation buffers in the heap (glibc's `mallopt`).
//!
//! A training step allocates and frees the same few-megabyte buffers (activations, gradients,
//! logits chunks) every step. glibc serves those from `mmap` above its threshold and gives freed
//! memory at the top of the heap back to the kernel above its trim threshold, so every step paid
//! for fresh pages again: page faults and the kernel zeroing them (about 4 % of a stage-1 profile,
//! plus the other core waiting on them). Raising both thresholds keeps the pages in the process;
//! no result changes, only where the memory comes from. Buffers over 32 MiB (glibc's cap for the
//! mmap threshold) are still mapped and unmapped, and the process may hold up to 1 GiB of freed
//! memory at the top of its heap instead of returning it.

/// Allocations up to this size come from the heap instead of their own mapping.
const MMAP_THRESHOLD: i32 = 32 << 20;
/// Freed memory at the top of the heap is returned to the kernel only above this much.
const TRIM_THRESHOLD: i32 = 1 << 30;

/// Sets the allocator's thresholds for training workloads; returns whether glibc took both
/// (always false off glibc, where nothing is changed). Call once, early in `main`.
pub fn keep_freed_buffers() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets allocator parameters; the values are within glibc's limits.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn glibc_takes_the_thresholds() {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        assert!(super::keep_freed_buffers());
    }
}
