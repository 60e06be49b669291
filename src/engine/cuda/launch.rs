//! Launch configurations, computed on the host (pure functions, unit-tested without a GPU):
//! grid sizes of grid-stride kernels, the query-tile list of packed attention, and the split-K
//! plan of cache attention.

use crate::engine::error::{EngineError, Result};

/// Threads per block of the element-wise kernels.
pub const BLOCK: u32 = 256;
/// Most blocks a grid-stride kernel is launched with.
pub const MAX_GRID: u32 = 65_535;

/// Blocks for a grid-stride kernel over `n` items (at least one).
pub fn grid_for(n: usize) -> u32 {
    let blocks = n.div_ceil(BLOCK as usize).max(1);
    blocks.min(MAX_GRID as usize) as u32
}

/// Whether a grid has no blocks (some dimension is 0): such a launch has no work and is skipped,
/// never rounded up to one block that would read an empty launch table.
pub fn empty_grid(grid: (u32, u32)) -> bool {
    grid.0 == 0 || grid.1 == 0
}

/// Dynamic shared memory every kernel may use without opting in (48 KiB).
pub const DEFAULT_DYNAMIC_SMEM: u32 = 48 * 1024;

/// Checks that `smem` dynamic bytes plus the kernel's `static_bytes` fit the device's opt-in
/// limit `optin` (bytes per block); returns whether the kernel must be opted in (more than
/// [`DEFAULT_DYNAMIC_SMEM`] dynamic bytes).
pub fn dynamic_smem_plan(name: &str, smem: u32, static_bytes: u32, optin: u32) -> Result<bool> {
    let total = smem as u64 + static_bytes as u64;
    if total > optin.max(DEFAULT_DYNAMIC_SMEM) as u64 {
        return Err(EngineError::Device(format!(
            "kernel {name} needs {total} bytes of shared memory per block ({smem} dynamic + \
             {static_bytes} static); the GPU allows {}",
            optin.max(DEFAULT_DYNAMIC_SMEM)
        )));
    }
    Ok(smem > DEFAULT_DYNAMIC_SMEM)
}

/// Query rows per block of the attention forward (4 warps x 4 rows).
pub const FWD_ROWS: u32 = 16;
/// Query rows per block of the dQ kernel and key rows per block of the dK/dV kernel.
pub const BWD_ROWS: u32 = 8;

/// Head dimensions the attention kernels are instantiated for.
pub const HEAD_DIMS: [usize; 4] = [16, 32, 64, 128];

/// Checks that `cu` partitions `t` rows (starts at 0, ends at `t`, never decreases).
pub fn check_cu_seqlens(cu: &[u32], t: usize, op: &'static str) -> Result<()> {
    let ok = cu.len() >= 2
        && cu[0] == 0
        && cu[cu.len() - 1] as usize == t
        && cu.windows(2).all(|w| w[1] >= w[0]);
    if ok {
        Ok(())
    } else {
        Err(EngineError::Shape {
            op,
            detail: format!("cu_seqlens {cu:?} do not partition {t} rows"),
        })
    }
}

/// The tiles of packed sequences: `(seq_start, seq_end, first_row)` for every `rows`-row tile
/// of every non-empty sequence, flattened (the kernels' `Tile` struct).
pub fn attention_tiles(cu: &[u32], rows: u32) -> Vec<u32> {
    let mut v = Vec::new();
    for w in cu.windows(2) {
        let (s, e) = (w[0], w[1]);
        let mut f = s;
        while f < e {
            v.extend_from_slice(&[s, e, f]);
            f += rows;
        }
    }
    v
}

/// Keys per split of cache attention, a multiple of 128 (four warps of 32 keys).
pub const MIN_SPLIT_KEYS: u32 = 512;
/// Most splits of one (row, head).
pub const MAX_SPLITS: u32 = 32;

/// The split-K plan `(splits, keys_per_split)` for a batch whose longest context is `max_len`
/// keys, given `row_heads` (rows x heads) blocks without splitting and `sms` multiprocessors:
/// split only when the unsplit grid would not fill the GPU, and never below
/// [`MIN_SPLIT_KEYS`] keys per split.
pub fn decode_splits(max_len: u32, row_heads: u32, sms: u32) -> (u32, u32) {
    let max_len = max_len.max(1);
    let by_len = max_len.div_ceil(MIN_SPLIT_KEYS).clamp(1, MAX_SPLITS);
    let want = (2 * sms.max(1)).div_ceil(row_heads.max(1)).max(1);
    let splits = by_len.min(want);
    let chunk = max_len.div_ceil(splits).div_ceil(128) * 128;
    let splits = max_len.div_ceil(chunk);
    (splits, chunk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_sizes() {
        assert_eq!(grid_for(0), 1);
        assert_eq!(grid_for(256), 1);
        assert_eq!(grid_for(257), 2);
        assert_eq!(grid_for(usize::MAX / 2), MAX_GRID);
    }

    #[test]
    fn empty_grids_are_skipped_and_dynamic_smem_is_checked() {
        assert!(empty_grid((0, 4)) && empty_grid((3, 0)) && !empty_grid((1, 1)));
        // No tiles for an empty batch: the attention grid is empty, not one block.
        assert!(empty_grid((
            attention_tiles(&[0, 0], 16).len() as u32 / 3,
            28
        )));
        assert_eq!(dynamic_smem_plan("k", 1024, 512, 232_448).ok(), Some(false));
        assert_eq!(dynamic_smem_plan("k", 100_000, 0, 232_448).ok(), Some(true));
        let e = dynamic_smem_plan("k", 200_000, 40_000, 232_448).unwrap_err();
        assert!(e.to_string().contains("kernel k needs 240000 bytes"), "{e}");
        // A device that reports no opt-in limit still allows the default.
        assert_eq!(dynamic_smem_plan("k", 48 * 1024, 0, 0).ok(), Some(false));
    }

    #[test]
    fn tiles_cover_every_row_of_every_sequence_once() {
        let cu = [0u32, 5, 5, 40];
        assert!(check_cu_seqlens(&cu, 40, "t").is_ok());
        let t = attention_tiles(&cu, 16);
        let tiles: Vec<&[u32]> = t.chunks(3).collect();
        assert_eq!(
            tiles,
            vec![&[0, 5, 0][..], &[5, 40, 5], &[5, 40, 21], &[5, 40, 37]]
        );
        let mut covered = [0; 40];
        for tl in &tiles {
            for r in tl[2]..(tl[2] + 16).min(tl[1]) {
                covered[r as usize] += 1;
            }
        }
        assert!(covered.iter().all(|&c| c == 1));
    }

    #[test]
    fn bad_cu_seqlens_are_an_error() {
        assert!(check_cu_seqlens(&[0, 3, 2, 4], 4, "t").is_err());
        assert!(check_cu_seqlens(&[1, 4], 4, "t").is_err());
        assert!(check_cu_seqlens(&[0, 3], 4, "t").is_err());
        assert!(check_cu_seqlens(&[0], 0, "t").is_err());
    }

    #[test]
    fn decode_splits_only_long_contexts_on_small_batches() {
        // Short context: one split.
        assert_eq!(decode_splits(100, 8, 132), (1, 128));
        // Long context, few rows: split to fill the GPU, each split at least 512 keys.
        let (s, c) = decode_splits(32_768, 8, 132);
        assert!(s > 1 && s <= MAX_SPLITS);
        assert!(c >= MIN_SPLIT_KEYS && c % 128 == 0);
        assert!(s * c >= 32_768 && (s - 1) * c < 32_768);
        // Many rows already fill the GPU: no split.
        assert_eq!(decode_splits(32_768, 4096, 132).0, 1);
    }
}
