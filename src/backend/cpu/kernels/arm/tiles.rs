//! The walk over a work unit shared by the NEON kernels (`neon.rs` and
//! `neon_mxfp4.rs`): rows in blocks, tokens in small groups.

use std::ops::Range;

/// Tokens per pass over a block of rows.
const TOKEN_GROUP: usize = 4;
/// Rows that share a pass over the token groups (they stay in cache).
const ROW_BLOCK: usize = 12;

/// The unit's rows in blocks of `ROW_BLOCK`, and within each block the
/// tokens in groups of at most `TOKEN_GROUP` (the block's rows stay in cache
/// across the groups): `tile(block rows, first token, tokens)`.
#[inline]
pub(super) fn for_each_tile(
    rows: Range<usize>,
    tokens: usize,
    mut tile: impl FnMut(Range<usize>, usize, usize),
) {
    let mut block = rows.start;
    while block < rows.end {
        let block_end = (block + ROW_BLOCK).min(rows.end);
        let mut t0 = 0;
        while t0 < tokens {
            let tn = (tokens - t0).min(TOKEN_GROUP);
            tile(block..block_end, t0, tn);
            t0 += tn;
        }
        block = block_end;
    }
}
