//! A count of the CUDA backend's device-to-host transfers (each one synchronises the stream), so
//! that tests and benchmarks can hold the number per decode step and per training step down.

use std::sync::atomic::{AtomicU64, Ordering};

/// Device-to-host transfers: how many and how many bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transfers {
    /// Number of device-to-host copies.
    pub count: u64,
    /// Bytes copied to the host.
    pub bytes: u64,
}

impl Transfers {
    /// The transfers made after `earlier` was taken.
    pub fn since(self, earlier: Transfers) -> Transfers {
        Transfers {
            count: self.count.saturating_sub(earlier.count),
            bytes: self.bytes.saturating_sub(earlier.bytes),
        }
    }
}

/// The running counter of one GPU context (shared by every dtype view of the backend).
#[derive(Debug, Default)]
pub struct TransferCounter {
    count: AtomicU64,
    bytes: AtomicU64,
}

impl TransferCounter {
    /// Records one device-to-host copy of `bytes` bytes.
    pub fn record(&self, bytes: usize) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// The totals so far.
    pub fn get(&self) -> Transfers {
        Transfers {
            count: self.count.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_copies_and_bytes_and_differences() {
        let c = TransferCounter::default();
        let before = c.get();
        c.record(8);
        c.record(1024);
        let d = c.get().since(before);
        assert_eq!(
            d,
            Transfers {
                count: 2,
                bytes: 1032
            }
        );
        assert_eq!(before.since(c.get()), Transfers::default());
    }
}
