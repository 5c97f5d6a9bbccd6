//! The numbers the host code and the kernels must agree on, defined once:
//! block and tile sizes, limits compiled into the kernels, the codes of the
//! weight formats and router kinds, the step metadata layout, and the
//! number formats' constants (from `crate::formats`).
//!
//! The kernels read them from `constants.cuh`, which `kernels/common.cuh`
//! includes and no file under `kernels/` holds: [`header`] writes it from
//! this table. NVRTC gets it with the other headers
//! (`kernels::headers`); the CPU emulator's build writes it with
//! `sparkrt kernels --constants` (`kernels/emu/build.sh`). A test below
//! refuses a kernel source that defines one of these names itself.

/// Defines each constant as a Rust `pub const` and lists it in [`TABLE`]
/// for [`header`]. Each entry reads `docs c_type NAME: RustType = value;`
/// where `c_type` is `int` or `unsigned`, the type of the C literal (so
/// that `#define NAME 4` and `#define NAME 4u` stay what the kernels were
/// written against).
macro_rules! kernel_constants {
    (@suffix int) => { "" };
    (@suffix unsigned) => { "u" };
    ($($(#[doc = $doc:literal])* $c_type:ident $name:ident: $ty:ty = $value:expr;)*) => {
        $($(#[doc = $doc])* pub const $name: $ty = $value;)*

        /// Every constant, in order, as [`Define`]s.
        pub const TABLE: &[Define] = &[$(Define {
            name: stringify!($name),
            value: $name as u64,
            suffix: kernel_constants!(@suffix $c_type),
            doc: &[$($doc),*],
        }),*];
    };
}

/// One `#define` of [`header`].
#[derive(Clone, Copy, Debug)]
pub struct Define {
    pub name: &'static str,
    pub value: u64,
    /// `"u"` for an unsigned C literal, `""` for an int.
    pub suffix: &'static str,
    /// The doc comment's lines, written above the define.
    pub doc: &'static [&'static str],
}

kernel_constants! {
    /// Threads of a warp.
    int WARP: u32 = 32;

    // ---- block sizes of the kernels that loop over a row or a range ----
    /// Threads of `embed`, `silu_mul`, `add`, `compact_rows`,
    /// `moe_combine` and `kv_copy_blocks`.
    int BLOCK_THREADS: u32 = 256;
    /// Threads of `rmsnorm` (one block per row).
    int NORM_THREADS: u32 = 256;
    /// Threads of `rope_table` (one block per row).
    int ROPE_THREADS: u32 = 128;
    /// Threads of `kv_append` (one block per row).
    int APPEND_THREADS: u32 = 128;

    // ---- number formats (`crate::formats`) ----
    /// Elements per E4M3 scale of NVFP4.
    unsigned NVFP4_GROUP: usize = crate::formats::NVFP4_GROUP;
    /// Elements per E8M0 scale of MXFP4.
    unsigned MXFP4_GROUP: usize = crate::formats::MXFP4_GROUP;
    /// Packed codes per MXFP4 block, in bytes.
    unsigned MXFP4_BLOCK_BYTES: usize = crate::formats::MXFP4_BLOCK_BYTES;
    /// The one E8M0 byte that is not a power of two.
    unsigned E8M0_NAN: u8 = crate::formats::E8M0_NAN;

    // ---- weight formats (`Weight::format`) ----
    unsigned FMT_F32: u32 = 0;
    unsigned FMT_BF16: u32 = 1;
    unsigned FMT_NVFP4: u32 = 2;
    unsigned FMT_MXFP4: u32 = 3;

    // ---- step metadata (plan::memory::StepMetadataPlan, common.cuh StepView) ----
    /// Words per sequence, and each word's index: start row, length, cached
    /// tokens, and where its sliding-window and full-attention tables start.
    unsigned SEQ_FIELDS: usize = crate::plan::memory::STEP_SEQ_FIELDS;
    unsigned SEQ_START: usize = 0;
    unsigned SEQ_LEN: usize = 1;
    unsigned SEQ_PAST: usize = 2;
    unsigned SEQ_SLIDING: usize = 3;
    unsigned SEQ_TABLE: usize = 4;
    /// A block-table entry with no block (`crate::step::NO_BLOCK`).
    unsigned NO_BLOCK: u32 = crate::step::NO_BLOCK;

    // ---- norms and RoPE (norm.cu) ----
    /// Largest `head_dim / 2` of the RoPE table's inverse frequencies.
    int MAX_ROPE_HALF: usize = 256;
    /// Largest head dimension of `qk_norm_rope` and `attention`.
    int MAX_HEAD_DIM: usize = 256;

    // ---- tensor-core tiles (mma.cuh): one m16n8k16 `mma.sync` ----
    /// Weight rows (output features) per tile.
    unsigned MMA_M: u32 = 16;
    /// Activation rows (tokens) per tile.
    unsigned MMA_N: u32 = 8;
    /// Reduction depth per tile.
    unsigned MMA_K: u32 = 16;

    // ---- dense linear layers (linear.cuh, matmul.cu) ----
    /// Rows per pass of the warp-per-row kernels.
    int TOKEN_TILE: usize = 8;
    /// Weights one `matmul` launch takes (q, k and v together).
    int MAX_JOBS: usize = 4;
    /// `matmul`: warps per block, one output feature each.
    int MATMUL_WARPS: u32 = 4;
    /// `matmul_mma`: warps per block, `MMA_M` output features each.
    int MMA_WARPS: u32 = 4;
    /// `matmul_mma`: tiles of `MMA_N` rows per block.
    int MMA_TILES: u32 = 8;
    /// `matmul_mma`: rows per block.
    unsigned MMA_TOKENS: u32 = MMA_TILES * MMA_N;

    // ---- experts (moe.cu) ----
    /// `route_group`: warps per block, one token each.
    int ROUTE_WARPS: u32 = 4;
    /// Largest expert count and top-k the router handles.
    int MAX_EXPERTS: usize = 1024;
    int MAX_TOP_K: usize = 32;
    /// `expert_gate_up`, `expert_down`: warps per block, one output feature each.
    int EXPERT_WARPS: u32 = 4;
    /// `expert_gate_up_mma`, `expert_down_mma`: warps per block, `MMA_M`
    /// features each.
    int EXPERT_MMA_WARPS: u32 = 4;
    /// Router kinds of `route_group`.
    unsigned ROUTER_SOFTMAX_TOPK: u32 = 0;
    unsigned ROUTER_SOFTMAX_TOPK_RENORM: u32 = 1;
    unsigned ROUTER_TOPK_SOFTMAX: u32 = 2;

    // ---- attention (attention.cu) ----
    /// `attention`: rows of a query tile, keys per shared-memory pass, warps
    /// per block.
    int Q_TILE: u32 = 16;
    int KEY_TILE: u32 = 32;
    int ATTN_WARPS: u32 = 4;
    /// Block pairs one `kv_copy_blocks` launch copies.
    int MAX_COPY_PAIRS: usize = 64;
}

/// The text of `constants.cuh`: a `#define` per entry of [`TABLE`], each
/// under its doc comment.
pub fn header() -> String {
    let mut text = String::from(
        "// constants.cuh: written by sparkrt from src/backend/cuda/constants.rs\n\
         // (`sparkrt kernels --constants`); change the numbers there.\n\
         #pragma once\n",
    );
    for define in TABLE {
        if !define.doc.is_empty() {
            text.push('\n');
        }
        for line in define.doc {
            text.push_str("//");
            text.push_str(line);
            text.push('\n');
        }
        text.push_str(&format!(
            "#define {} {}{}\n",
            define.name, define.value, define.suffix
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::backend::cuda::kernels;

    /// Every kernel source and emulator file, as (name, text).
    fn sources() -> Vec<(&'static str, &'static str)> {
        let mut files: Vec<(&str, &str)> = kernels::FILES
            .iter()
            .map(|f| (f.name, f.source))
            .chain(kernels::SOURCE_HEADERS)
            .collect();
        files.extend([
            ("emu/shim.h", include_str!("../../../kernels/emu/shim.h")),
            ("emu/mma.h", include_str!("../../../kernels/emu/mma.h")),
            (
                "emu/driver.cpp",
                include_str!("../../../kernels/emu/driver.cpp"),
            ),
        ]);
        files
    }

    /// The name of a `#define NAME ...` line.
    fn defined_name(line: &str) -> Option<&str> {
        let rest = line.trim_start().strip_prefix("#define")?;
        let name = rest.trim_start();
        let end = name
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(name.len());
        Some(&name[..end])
    }

    #[test]
    fn no_kernel_source_defines_a_shared_constant_or_any_name_twice() {
        // DYNAMIC_SHARED_FLOATS has one definition on each side of an #ifdef.
        let alternatives = ["DYNAMIC_SHARED_FLOATS"];
        let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
        for (file, text) in sources() {
            for name in text.lines().filter_map(defined_name) {
                assert!(
                    TABLE.iter().all(|d| d.name != name),
                    "{file} defines {name}, which constants.cuh defines (src/backend/cuda/constants.rs)"
                );
                if let Some(first) = seen.insert(name, file) {
                    assert!(
                        alternatives.contains(&name),
                        "{name} is defined in {first} and again in {file}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_header_defines_each_constant_once_with_its_value() {
        let text = header();
        let defines: Vec<&str> = text.lines().filter(|l| l.starts_with("#define")).collect();
        assert_eq!(defines.len(), TABLE.len());
        let mut names: Vec<&str> = TABLE.iter().map(|d| d.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TABLE.len(), "a name listed twice");
        assert!(defines.contains(&"#define MAX_HEAD_DIM 256"));
        assert!(defines.contains(&"#define FMT_MXFP4 3u"));
        assert!(defines.contains(&"#define MMA_TOKENS 64u"));
        assert!(defines.contains(&"#define NO_BLOCK 4294967295u"));
        assert!(defines.contains(&"#define E8M0_NAN 255u"));
        assert!(text.contains("// Largest head dimension of `qk_norm_rope` and `attention`.\n#define MAX_HEAD_DIM 256\n"));
    }
}
