//! Output capture that keeps only the tail of a stream, with a size cap.

use serde::{Deserialize, Serialize};

/// A byte sink that remembers the total size and keeps the last `cap` bytes.
#[derive(Debug)]
pub struct TailBuffer {
    cap: usize,
    buf: Vec<u8>,
    total: u64,
}

impl TailBuffer {
    /// An empty buffer keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        TailBuffer {
            cap,
            buf: Vec::with_capacity(cap.min(64 << 10)),
            total: 0,
        }
    }

    /// Appends bytes, discarding the oldest ones beyond the cap.
    pub fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        if self.cap == 0 {
            return;
        }
        if data.len() >= self.cap {
            self.buf.clear();
            self.buf.extend_from_slice(&data[data.len() - self.cap..]);
            return;
        }
        self.buf.extend_from_slice(data);
        // Compact lazily so that pushing is amortised O(len).
        if self.buf.len() > 2 * self.cap {
            let cut = self.buf.len() - self.cap;
            self.buf.drain(..cut);
        }
    }

    /// Total bytes pushed so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Finishes capture: the kept tail as text (invalid UTF-8 replaced).
    pub fn finish(self) -> CapturedOutput {
        let start = self.buf.len().saturating_sub(self.cap);
        let kept = &self.buf[start..];
        CapturedOutput {
            total_bytes: self.total,
            truncated: self.total > kept.len() as u64,
            tail: String::from_utf8_lossy(kept).into_owned(),
        }
    }
}

/// What a run printed: its total size and the kept tail.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CapturedOutput {
    /// Bytes written in all, including the discarded head.
    pub total_bytes: u64,
    /// True when the head was discarded.
    pub truncated: bool,
    /// The last bytes of the combined stdout and stderr.
    pub tail: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_tail_and_counts_total() {
        let mut t = TailBuffer::new(5);
        t.push(b"abc");
        t.push(b"defg");
        t.push(b"hi");
        let out = t.finish();
        assert_eq!(out.total_bytes, 9);
        assert!(out.truncated);
        assert_eq!(out.tail, "efghi");
    }

    #[test]
    fn large_single_push_and_small_output() {
        let mut t = TailBuffer::new(4);
        t.push(b"0123456789");
        assert_eq!(t.finish().tail, "6789");
        let mut t = TailBuffer::new(100);
        t.push(b"ok");
        let out = t.finish();
        assert!(!out.truncated);
        assert_eq!(out.tail, "ok");
    }
}
