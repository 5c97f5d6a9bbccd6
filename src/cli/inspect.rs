//! `sparkrt inspect DIR [--json]`: what a model folder holds, from its
//! config and safetensors headers (no tensor data read).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use indicatif::HumanBytes;
use serde::Serialize;

use crate::checkpoint::check::tensor_problems;
use crate::checkpoint::groups::{bytes_by_group, group_of};
use crate::checkpoint::{CheckpointError, HeaderSet, ModelConfig, TensorInfo, TensorProblem};
use crate::checkpoint::{Dtype, read_headers};
use crate::geometry::{Quantization, WeightGroup};

#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// Model folder: config.json plus model.safetensors or an index and shards.
    pub dir: PathBuf,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// What `inspect` prints (the JSON form is this struct serialized).
#[derive(Clone, Debug, Serialize)]
pub struct InspectReport {
    pub architecture: &'static str,
    pub num_tensors: usize,
    /// Parameters: elements of float tensors plus two per packed FP4 byte
    /// (scales are not parameters).
    pub num_parameters: u64,
    /// Bytes of tensor data over all files.
    pub total_bytes: u64,
    /// Bytes by plan group (`embeddings`, `attention`, …).
    pub groups: BTreeMap<&'static str, u64>,
    /// The number formats each group's matrices are stored in (`bf16`,
    /// `nvfp4`, `fp8`, …), from their tensors and the quantization config.
    pub group_formats: BTreeMap<&'static str, Vec<&'static str>>,
    /// Bytes the checkpoint carries that text serving never reads, by
    /// prefix (a vision tower, MTP layers).
    pub unused: BTreeMap<&'static str, u64>,
    pub dtypes: BTreeMap<&'static str, DtypeStats>,
    pub quantization: Option<&'static str>,
    /// Module patterns the quantization leaves unquantized.
    pub excluded_modules: Vec<String>,
    pub shards: Vec<ShardReport>,
    /// Missing, unexpected or mis-shaped tensors; empty for a sound folder.
    pub problems: Vec<String>,
    #[serde(skip)]
    pub tensor_problems: Vec<TensorProblem>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct DtypeStats {
    pub tensors: usize,
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ShardReport {
    pub file: String,
    pub bytes: u64,
    pub tensors: usize,
}

/// Prints the report for `args.dir`. A folder that cannot be read, or whose
/// tensors do not match its architecture, is an error (exit code 2); the
/// report is still printed first in the second case.
pub fn run(args: &InspectArgs) -> Result<(), CheckpointError> {
    let report = report(&args.dir)?;
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        serde_json::to_writer_pretty(&mut out, &report)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        write_table(&mut out, &args.dir, &report)
    };
    written.map_err(|source| CheckpointError::Io {
        path: PathBuf::from("<stdout>"),
        source,
    })?;
    if report.tensor_problems.is_empty() {
        Ok(())
    } else {
        Err(CheckpointError::Tensors {
            problems: report.tensor_problems,
        })
    }
}

/// Builds the report from `dir/config.json` and the safetensors headers.
pub fn report(dir: &Path) -> Result<InspectReport, CheckpointError> {
    let config = ModelConfig::load(dir)?;
    let headers = read_headers(dir)?;
    let by_group = bytes_by_group(config.geometry.architecture, &headers.tensors);
    let mut dtypes: BTreeMap<&'static str, DtypeStats> = BTreeMap::new();
    for tensor in &headers.tensors {
        let stats = dtypes.entry(tensor.dtype.name()).or_default();
        stats.tensors += 1;
        stats.bytes += tensor.byte_len;
    }
    let problems = tensor_problems(&config, &headers);
    Ok(InspectReport {
        architecture: config.geometry.architecture.name(),
        num_tensors: headers.tensors.len(),
        num_parameters: headers.tensors.iter().map(|t| parameters(&config, t)).sum(),
        total_bytes: headers.total_tensor_bytes(),
        groups: by_group
            .bytes
            .iter()
            .map(|(group, &bytes)| (group.name(), bytes))
            .collect(),
        unused: by_group.unused.clone(),
        group_formats: group_formats(&config, &headers.tensors),
        dtypes,
        quantization: config.quantization.as_ref().map(|q| q.method.name()),
        excluded_modules: config
            .quantization
            .as_ref()
            .map(|q| {
                q.excluded_modules
                    .iter()
                    .map(|p| p.source().to_string())
                    .collect()
            })
            .unwrap_or_default(),
        shards: shard_reports(&headers),
        problems: problems.iter().map(ToString::to_string).collect(),
        tensor_problems: problems,
    })
}

/// The formats of each group's matrices (sorted, each named once).
fn group_formats(
    config: &ModelConfig,
    tensors: &[TensorInfo],
) -> BTreeMap<&'static str, Vec<&'static str>> {
    let architecture = config.geometry.architecture;
    let mut formats: BTreeMap<&'static str, Vec<&'static str>> = BTreeMap::new();
    for tensor in tensors {
        let (Some(format), Some(group)) = (
            matrix_format(config, tensor),
            group_of(architecture, &tensor.name),
        ) else {
            continue;
        };
        let list = formats.entry(group.name()).or_default();
        if !list.contains(&format) {
            list.push(format);
            list.sort_unstable();
        }
    }
    formats
}

/// Names of a quantized module's main tensor other than `.weight`.
const PACKED_SUFFIXES: [&str; 2] = [".weight_packed", ".qweight"];

/// The format of the matrix whose main tensor `tensor` is (`None` for
/// scales, norms, biases and other vectors): a float `.weight` is stored as
/// its dtype (an embedding a config glob matches is still bf16), a packed
/// one as its module's format in the config.
fn matrix_format(config: &ModelConfig, tensor: &TensorInfo) -> Option<&'static str> {
    let name = tensor.name.as_str();
    if name.ends_with("_blocks") {
        return Some(Quantization::Mxfp4.name());
    }
    // GPTQ's packed INT4 weight (its qzeros and scales are 2-D too, but not
    // the matrix).
    if name.ends_with(".qweight") {
        return Some(Quantization::Int4.name());
    }
    // Stacked experts (`experts.gate_up_proj`, `[E, rows, cols]`) are
    // matrices too; a convolution's `[channels, 1, kernel]` weight is not.
    let stacked = tensor.shape.len() == 3
        && (name.ends_with("experts.gate_up_proj") || name.ends_with("experts.down_proj"));
    let module = match name.strip_suffix(".weight") {
        Some(module) if tensor.shape.len() == 2 => module,
        _ if stacked => name,
        _ => {
            return PACKED_SUFFIXES
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .map(|module| config.linear_format(module).name());
        }
    };
    Some(match tensor.dtype {
        Dtype::Bf16 => "bf16",
        Dtype::F16 => "f16",
        Dtype::F32 => "f32",
        _ => config.linear_format(module).name(),
    })
}

/// Parameters a tensor stands for: packed FP4 bytes hold two, FP8 bytes
/// one, scales none.
fn parameters(config: &ModelConfig, tensor: &TensorInfo) -> u64 {
    let name = tensor.name.as_str();
    let is_scale = [
        ".weight_scale",
        ".weight_scale_2",
        ".weight_scale_inv",
        ".input_scale",
        ".weight_global_scale",
        ".input_global_scale",
        "_scales",
        ".scales",
        ".qzeros",
        ".g_idx",
    ]
    .iter()
    .any(|suffix| name.ends_with(suffix));
    let packed_fp4 = tensor.dtype == Dtype::U8
        && (name.ends_with("_blocks")
            || name.ends_with(".weight_packed")
            || name
                .strip_suffix(".weight")
                .is_some_and(|module| config.linear_format(module) == Quantization::Nvfp4));
    if is_scale {
        0
    } else if tensor.dtype == Dtype::I32 && name.ends_with(".qweight") {
        // 8 INT4 codes per int32.
        crate::formats::INT4_PER_WORD as u64 * tensor.numel()
    } else if packed_fp4 {
        2 * tensor.numel()
    } else {
        tensor.numel()
    }
}

fn shard_reports(headers: &HeaderSet) -> Vec<ShardReport> {
    headers
        .files
        .iter()
        .enumerate()
        .map(|(i, shard)| ShardReport {
            file: shard.path.file_name().map_or_else(
                || shard.path.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            ),
            bytes: shard.file_bytes,
            tensors: headers.tensors.iter().filter(|t| t.file == i).count(),
        })
        .collect()
}

fn write_table(out: &mut impl Write, dir: &Path, r: &InspectReport) -> std::io::Result<()> {
    writeln!(out, "model         {}", dir.display())?;
    writeln!(out, "architecture  {}", r.architecture)?;
    writeln!(
        out,
        "quantization  {}",
        r.quantization.unwrap_or("none (bf16)")
    )?;
    if !r.excluded_modules.is_empty() {
        writeln!(out, "  unquantized {}", r.excluded_modules.join(", "))?;
    }
    writeln!(out, "parameters    {}", r.num_parameters)?;
    writeln!(out, "tensors       {}", r.num_tensors)?;
    writeln!(
        out,
        "weight bytes  {} ({})",
        r.total_bytes,
        HumanBytes(r.total_bytes)
    )?;
    writeln!(out, "\nby group")?;
    // In the plan's order rather than alphabetically.
    for group in WeightGroup::ALL.map(WeightGroup::name) {
        let bytes = r.groups.get(group).copied().unwrap_or(0);
        let formats = r
            .group_formats
            .get(group)
            .map_or(String::new(), |f| f.join(", "));
        writeln!(
            out,
            "  {group:<16} {bytes:>16}  {:<10} {formats}",
            HumanBytes(bytes).to_string()
        )?;
    }
    for (prefix, bytes) in &r.unused {
        writeln!(
            out,
            "  {prefix:<16} {bytes:>16}  {}  (not used by text serving)",
            HumanBytes(*bytes)
        )?;
    }
    writeln!(out, "\nby dtype")?;
    for (dtype, stats) in &r.dtypes {
        writeln!(
            out,
            "  {dtype:<12} {:>16}  {:>6} tensors",
            stats.bytes, stats.tensors
        )?;
    }
    writeln!(out, "\nshards")?;
    for shard in &r.shards {
        writeln!(
            out,
            "  {:<40} {:>16}  {:>6} tensors",
            shard.file, shard.bytes, shard.tensors
        )?;
    }
    if r.problems.is_empty() {
        writeln!(out, "\nproblems      none")?;
    } else {
        writeln!(out, "\nproblems      {}", r.problems.len())?;
        for problem in &r.problems {
            writeln!(out, "  - {problem}")?;
        }
    }
    Ok(())
}
