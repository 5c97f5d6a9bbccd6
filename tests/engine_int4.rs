//! The GPTQ-layout INT4 fixtures (scripts/make-int4-fixtures.py) on the CPU
//! engine: prompt logits within 2e-3 of transformers in f32 on the
//! dequantized weights (the kernels sum in f32 in another order), greedy
//! continuations identical; the hostile variants are refused naming the
//! tensor or the option; the config-alone weight estimate equals the
//! headers' bytes.

use crate::common;
use crate::fixture_runs::{max_abs_diff, profile, reference, serve_greedy};

use sparkrt::checkpoint::PageCachePolicy;
use sparkrt::runtime::{HostSource, Loaded};

const INT4_FIXTURES: [&str; 2] = ["qwen3-moe-tiny-int4", "qwen3-moe-tiny-int4-asym"];

fn host() -> std::path::PathBuf {
    common::fixture("hosts/box24")
}

/// Opens fixture folder `dir` with profile `name` on the CPU: the error's text on failure.
macro_rules! open {
    ($dir:expr, $name:expr) => {{
        let root = host();
        let host = HostSource {
            root: &root,
            kubelet_config: None,
        };
        Loaded::open_cpu($dir, Some(&profile($name)), &host, PageCachePolicy::Keep)
            .map_err(|e| format!("{e:#}"))
    }};
}

#[test]
fn int4_fixtures_match_the_transformers_reference() {
    for name in INT4_FIXTURES {
        let r = reference(name);
        let loaded = open!(&common::fixture(name), name).unwrap();
        let source = loaded.source();
        let mut engine = loaded.engine(&source).unwrap();
        let out = serve_greedy(
            &mut engine,
            std::slice::from_ref(&r.input_ids),
            r.greedy_ids.len(),
        );
        assert_eq!(out[0].prompt_logits.len(), r.input_ids.len() * r.vocab);
        let diff = max_abs_diff(&out[0].prompt_logits, &r.logits);
        assert!(diff < 2e-3, "{name}: prompt logits differ by {diff}");
        assert_eq!(out[0].tokens, r.greedy_ids, "{name}: greedy continuation");
    }
}
