//! `serve`'s flags that exist for command lines written for `vllm serve`:
//! each is accepted where it means what it means in vLLM, and refused
//! (exit 2, naming the flag and why) where sparkrt cannot do it.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::text::GenerationDefaults;

#[derive(Debug, Default, clap::Args)]
pub struct VllmArgs {
    /// Checkpoint folder, as `vllm serve MODEL` takes it (the same as
    /// `--model`; both given and different is an error).
    #[arg(value_name = "MODEL")]
    pub model_path: Option<PathBuf>,
    /// Where a request's unset sampling fields take their defaults: `auto`
    /// the checkpoint's generation_config.json, `vllm` none (OpenAI's
    /// neutral values), or a folder holding a generation_config.json.
    #[arg(long, value_name = "auto|vllm|DIR", default_value = "auto")]
    pub generation_config: String,
    /// vLLM's flag, accepted: tool calls are parsed whenever a request
    /// sends tools (see --tool-call-parser).
    #[arg(long)]
    pub enable_auto_tool_choice: bool,
    /// vLLM's flag, accepted: sparkrt never runs code from a checkpoint.
    #[arg(long)]
    pub trust_remote_code: bool,
    /// Weights' compute type: auto, bfloat16 or bf16 (the one sparkrt runs).
    #[arg(long, value_name = "DTYPE", default_value = "auto")]
    pub dtype: String,
    /// The seed of requests that give none: each takes the next value of
    /// one random stream seeded here, so a run is reproducible.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// vLLM's flag: the checkpoint's quantization method (`modelopt`,
    /// `compressed-tensors`, `mxfp4`, …). sparkrt reads it from the
    /// checkpoint; a value naming another method, or one sparkrt does not
    /// read (awq, bitsandbytes, gguf, …), is refused (exit 2).
    #[arg(long, short = 'q', value_name = "METHOD")]
    pub quantization: Option<String>,
    /// GPUs one model is split over; only 1 is supported.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub tensor_parallel_size: usize,
}

/// Refuses `--quantization METHOD` unless it names the method the
/// checkpoint in `dir` is stored with: never a silent fallback to another
/// format.
pub fn check_quantization(method: Option<&str>, dir: &Path) -> Result<()> {
    let Some(method) = method else {
        return Ok(());
    };
    let config = crate::checkpoint::ModelConfig::load(dir)?;
    let scheme = config.quantization.as_ref().map(|q| q.scheme);
    let accepted: &[&str] = scheme.map_or(&["none"], |s| s.vllm_names());
    if accepted.contains(&method) {
        return Ok(());
    }
    let stored = scheme.map_or("not quantized (bf16)".to_string(), |s| {
        format!("stored as {}", s.name())
    });
    bail!(
        "--quantization {method} does not match the checkpoint in {}: it is {stored} (give {} \
         or leave the flag out; sparkrt reads the format from the checkpoint: {})",
        dir.display(),
        accepted.join(" or "),
        crate::checkpoint::quant_config::SUPPORTED
    )
}

/// Where the sampling defaults come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GenerationConfig {
    Auto,
    Vllm,
    Folder(PathBuf),
}

impl VllmArgs {
    /// Refuses what sparkrt cannot do, logs what it accepts and ignores.
    pub fn check(&self) -> Result<()> {
        match self.dtype.as_str() {
            "auto" | "bfloat16" | "bf16" => {}
            other => bail!(
                "--dtype {other} is not supported: sparkrt computes in bfloat16 (auto, bfloat16 \
                 or bf16); quantized checkpoints keep their own weight format"
            ),
        }
        if self.tensor_parallel_size != 1 {
            bail!(
                "--tensor-parallel-size {} is not supported yet: sparkrt serves a model on one \
                 device (1 is accepted); `sparkrt plan --tensor-parallel-size N` plans each \
                 node's share",
                self.tensor_parallel_size
            );
        }
        if self.trust_remote_code {
            tracing::info!(
                "--trust-remote-code accepted: sparkrt never runs code from a checkpoint, it reads \
                 only its config, tokenizer and weights"
            );
        }
        if self.enable_auto_tool_choice {
            tracing::info!(
                "--enable-auto-tool-choice accepted: tool calls are parsed whenever a request \
                 sends tools"
            );
        }
        Ok(())
    }

    /// `--model` and the positional MODEL, which must agree.
    pub fn model(&self, flag: Option<&Path>) -> Result<Option<PathBuf>> {
        match (flag, &self.model_path) {
            (Some(flag), Some(positional)) if flag != positional => bail!(
                "the model is given twice and differently: MODEL {} and --model {}",
                positional.display(),
                flag.display()
            ),
            (Some(path), _) => Ok(Some(path.to_path_buf())),
            (None, Some(path)) => Ok(Some(path.clone())),
            (None, None) => Ok(None),
        }
    }

    pub fn generation_config(&self) -> GenerationConfig {
        match self.generation_config.as_str() {
            "auto" => GenerationConfig::Auto,
            "vllm" => GenerationConfig::Vllm,
            dir => GenerationConfig::Folder(PathBuf::from(dir)),
        }
    }
}

impl GenerationConfig {
    /// The defaults in force for checkpoint `dir`, and a line saying where
    /// they come from (for the start-up summary).
    pub fn load(&self, dir: &Path) -> Result<(GenerationDefaults, String)> {
        let (from, folder) = match self {
            GenerationConfig::Vllm => {
                return Ok((
                    GenerationDefaults::default(),
                    "vllm's neutral defaults (--generation-config vllm)".to_string(),
                ));
            }
            GenerationConfig::Auto => ("the checkpoint's", dir),
            GenerationConfig::Folder(folder) => {
                if !folder.is_dir() {
                    bail!(
                        "--generation-config {}: not a folder (auto, vllm or a folder holding \
                         generation_config.json)",
                        folder.display()
                    );
                }
                ("", folder.as_path())
            }
        };
        let defaults = GenerationDefaults::read(folder)?;
        let file = folder.join("generation_config.json");
        if let Err(e) = crate::server::openai::check_generation_defaults(&defaults) {
            bail!(
                "{}: {} (the default of every request)",
                file.display(),
                e.message
            );
        }
        let line = if from.is_empty() {
            format!("{defaults} (from {})", file.display())
        } else {
            format!("{defaults} ({from} generation_config.json)")
        };
        Ok((defaults, line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_positional_model_and_the_flag_must_agree() {
        let args = VllmArgs {
            model_path: Some(PathBuf::from("a")),
            ..VllmArgs::default()
        };
        assert_eq!(args.model(None).unwrap(), Some(PathBuf::from("a")));
        assert_eq!(
            args.model(Some(Path::new("a"))).unwrap(),
            Some(PathBuf::from("a"))
        );
        let err = args.model(Some(Path::new("b"))).unwrap_err().to_string();
        assert!(err.contains("MODEL a and --model b"), "{err}");
        assert_eq!(VllmArgs::default().model(None).unwrap(), None);
    }

    #[test]
    fn generation_config_names_its_three_forms() {
        let with = |s: &str| VllmArgs {
            generation_config: s.to_string(),
            ..VllmArgs::default()
        };
        assert_eq!(with("auto").generation_config(), GenerationConfig::Auto);
        assert_eq!(with("vllm").generation_config(), GenerationConfig::Vllm);
        assert_eq!(
            with("/x").generation_config(),
            GenerationConfig::Folder(PathBuf::from("/x"))
        );
    }
}
