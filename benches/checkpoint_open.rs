//! Benchmark: validating a full-size sharded checkpoint, and what mapping
//! costs in memory.
//!
//! 1. Writes a checkpoint shaped like Qwen3-30B-A3B in BF16 (48 layers × 128
//!    experts, 18,867 tensors, ~57 GiB in 16 shards) as sparse files, then
//!    times `read_headers`, `Checkpoint::open` (map + validate) and the
//!    architecture check, median of repeated runs, with the headers in the
//!    page cache and after dropping them.
//! 2. Touches every weight of the tiny fixture (and of a 256 MiB generated
//!    checkpoint) through the mapping and prints RssAnon / RssFile before and
//!    after: the bytes show up as file pages, not as a private copy.
//!
//! Run: `cargo bench --bench checkpoint_open`.

// A benchmark that cannot set itself up stops with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use sparkrt::checkpoint::{Checkpoint, ModelConfig, check_tensors, read_headers};

const REPEATS: usize = 21;

/// Qwen3-30B-A3B's geometry (its published config.json).
const HIDDEN: usize = 2048;
const LAYERS: usize = 48;
const HEADS: usize = 32;
const KV_HEADS: usize = 4;
const HEAD_DIM: usize = 128;
const EXPERTS: usize = 128;
const MOE_INTERMEDIATE: usize = 768;
const VOCAB: usize = 151_936;
const SHARDS: usize = 16;

fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    let written = write_qwen3_30b(dir.path());
    let headers = read_headers(dir.path()).expect("valid checkpoint");
    println!(
        "sharded checkpoint: {} files, {} tensors, {:.1} GiB of (sparse) tensor data",
        headers.files.len(),
        headers.tensors.len(),
        headers.total_tensor_bytes() as f64 / (1u64 << 30) as f64
    );
    assert_eq!(headers.total_tensor_bytes(), written);

    let config = ModelConfig::load(dir.path()).expect("config");
    let files: Vec<_> = headers.files.iter().map(|f| f.path.clone()).collect();
    // Wall time suffers when other processes share the cores; this thread's
    // CPU time does not, so both are printed.
    let report = |label: &str, run: &dyn Fn()| {
        let warm = median(|| {
            let start = Timer::start();
            run();
            start.elapsed()
        });
        let cold = median(|| {
            drop_page_cache(&files);
            let start = Timer::start();
            run();
            start.elapsed()
        });
        println!(
            "  {label:<36} warm {:>6.1} ms (cpu {:>6.1})   cold {:>6.1} ms (cpu {:>6.1})",
            ms(warm.wall),
            ms(warm.cpu),
            ms(cold.wall),
            ms(cold.cpu)
        );
    };
    println!("  median of {REPEATS} runs; cold = after POSIX_FADV_DONTNEED on every shard");
    report("read_headers (headers only)", &|| {
        read_headers(dir.path()).expect("valid");
    });
    report("Checkpoint::open (map + validate)", &|| {
        Checkpoint::open(dir.path()).expect("valid");
    });
    report("read_headers + check_tensors", &|| {
        let headers = read_headers(dir.path()).expect("valid");
        check_tensors(&config, &headers).expect("complete");
    });
    drop(dir);

    println!("\nmemory after touching every weight through the mapping (/proc/self/status):");
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3-moe-tiny");
    touch_and_report("qwen3-moe-tiny fixture", &tiny);
    let big = tempfile::tempdir().expect("temp dir");
    write_dense_checkpoint(big.path(), 256 << 20);
    touch_and_report("generated 256 MiB checkpoint", big.path());
}

/// Wall-clock and this thread's CPU time of one run.
#[derive(Clone, Copy)]
struct Elapsed {
    wall: Duration,
    cpu: Duration,
}

struct Timer {
    wall: Instant,
    cpu: Duration,
}

impl Timer {
    fn start() -> Timer {
        Timer {
            wall: Instant::now(),
            cpu: thread_cpu_time(),
        }
    }

    fn elapsed(&self) -> Elapsed {
        Elapsed {
            wall: self.wall.elapsed(),
            cpu: thread_cpu_time().saturating_sub(self.cpu),
        }
    }
}

fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: FFI call writing into a timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Medians (wall and CPU separately) of `REPEATS` runs of `run`, which times
/// itself so that set-up such as dropping the page cache stays outside.
fn median(mut run: impl FnMut() -> Elapsed) -> Elapsed {
    let runs: Vec<Elapsed> = (0..REPEATS).map(|_| run()).collect();
    let middle = |mut times: Vec<Duration>| {
        times.sort();
        times[REPEATS / 2]
    };
    Elapsed {
        wall: middle(runs.iter().map(|r| r.wall).collect()),
        cpu: middle(runs.iter().map(|r| r.cpu).collect()),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn drop_page_cache(files: &[std::path::PathBuf]) {
    for path in files {
        if let Ok(file) = File::open(path) {
            // SAFETY: FFI call on a descriptor we own; reads no memory.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
}

/// Writes one safetensors file whose data section is `data_len` bytes, left
/// sparse (never written) unless `fill` is set.
fn write_file(path: &Path, tensors: &[(String, Vec<usize>)], fill: bool) -> u64 {
    let mut entries = Vec::with_capacity(tensors.len());
    let mut offset = 0u64;
    for (name, shape) in tensors {
        let len = shape.iter().product::<usize>() as u64 * 2;
        entries.push(format!(
            r#""{name}":{{"dtype":"BF16","shape":{shape:?},"data_offsets":[{offset},{}]}}"#,
            offset + len
        ));
        offset += len;
    }
    let mut json = format!("{{{}}}", entries.join(","));
    while json.len() % 8 != 0 {
        json.push(' ');
    }
    let mut file = File::create(path).expect("create shard");
    file.write_all(&(json.len() as u64).to_le_bytes())
        .expect("write");
    file.write_all(json.as_bytes()).expect("write");
    if fill {
        // Arbitrary but non-zero contents, so no page is shared with zero pages.
        let chunk: Vec<u8> = (0..1 << 20)
            .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        let mut left = offset;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            file.write_all(&chunk[..n]).expect("write");
            left -= n as u64;
        }
    } else {
        file.set_len(8 + json.len() as u64 + offset)
            .expect("extend");
    }
    file.sync_all().expect("sync");
    offset
}

/// Qwen3-30B-A3B in BF16, three layers per shard; returns tensor bytes.
fn write_qwen3_30b(dir: &Path) -> u64 {
    let q = HEADS * HEAD_DIM;
    let kv = KV_HEADS * HEAD_DIM;
    let mut shards: Vec<Vec<(String, Vec<usize>)>> = vec![Vec::new(); SHARDS];
    shards[0].push(("model.embed_tokens.weight".into(), vec![VOCAB, HIDDEN]));
    for layer in 0..LAYERS {
        let shard = &mut shards[layer * SHARDS / LAYERS];
        let p = format!("model.layers.{layer}");
        let mut add = |name: String, shape: Vec<usize>| shard.push((name, shape));
        add(format!("{p}.input_layernorm.weight"), vec![HIDDEN]);
        add(format!("{p}.post_attention_layernorm.weight"), vec![HIDDEN]);
        add(format!("{p}.self_attn.q_proj.weight"), vec![q, HIDDEN]);
        add(format!("{p}.self_attn.k_proj.weight"), vec![kv, HIDDEN]);
        add(format!("{p}.self_attn.v_proj.weight"), vec![kv, HIDDEN]);
        add(format!("{p}.self_attn.o_proj.weight"), vec![HIDDEN, q]);
        add(format!("{p}.self_attn.q_norm.weight"), vec![HEAD_DIM]);
        add(format!("{p}.self_attn.k_norm.weight"), vec![HEAD_DIM]);
        add(format!("{p}.mlp.gate.weight"), vec![EXPERTS, HIDDEN]);
        for e in 0..EXPERTS {
            add(
                format!("{p}.mlp.experts.{e}.gate_proj.weight"),
                vec![MOE_INTERMEDIATE, HIDDEN],
            );
            add(
                format!("{p}.mlp.experts.{e}.up_proj.weight"),
                vec![MOE_INTERMEDIATE, HIDDEN],
            );
            add(
                format!("{p}.mlp.experts.{e}.down_proj.weight"),
                vec![HIDDEN, MOE_INTERMEDIATE],
            );
        }
    }
    shards[SHARDS - 1].push(("model.norm.weight".into(), vec![HIDDEN]));
    shards[SHARDS - 1].push(("lm_head.weight".into(), vec![VOCAB, HIDDEN]));

    let mut weight_map = serde_json::Map::new();
    let mut total = 0;
    for (i, tensors) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{SHARDS:05}.safetensors", i + 1);
        total += write_file(&dir.join(&file), tensors, false);
        for (name, _) in tensors {
            weight_map.insert(name.clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).expect("index");
    let config = serde_json::json!({
        "model_type": "qwen3_moe", "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "num_experts": EXPERTS, "num_experts_per_tok": 8, "moe_intermediate_size": MOE_INTERMEDIATE,
        "intermediate_size": 6144, "vocab_size": VOCAB, "rope_theta": 1_000_000.0,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": false,
        "norm_topk_prob": true, "rms_norm_eps": 1e-6, "max_position_embeddings": 40960
    });
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
    total
}

/// A single-file checkpoint of `bytes` of real (written) BF16 data.
fn write_dense_checkpoint(dir: &Path, bytes: usize) {
    let per_tensor = 16 << 20;
    let tensors: Vec<(String, Vec<usize>)> = (0..bytes / per_tensor)
        .map(|i| (format!("w{i}"), vec![per_tensor / 2]))
        .collect();
    write_file(&dir.join("model.safetensors"), &tensors, true);
}

/// (RssAnon, RssFile) of this process, in bytes.
fn rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("RssAnon:"), field("RssFile:"))
}

fn touch_and_report(label: &str, dir: &Path) {
    let checkpoint = Checkpoint::open(dir).expect("valid checkpoint");
    let names: Vec<String> = checkpoint.tensor_names().map(str::to_string).collect();
    let weight_bytes = checkpoint.headers().total_tensor_bytes();
    let (anon_before, file_before) = rss();
    let mut sum = 0u64;
    for name in &names {
        let view = checkpoint.tensor(name).expect("tensor");
        // One read per 64-byte line touches every page; summing all bytes
        // would only add time.
        for chunk in view.bytes().chunks(64) {
            sum = sum.wrapping_add(u64::from(chunk[0]));
        }
    }
    std::hint::black_box(sum);
    let (anon_after, file_after) = rss();
    checkpoint.release().expect("release");
    let (_, file_released) = rss();
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    println!("  {label}: {:.2} MiB of weights", mib(weight_bytes));
    println!(
        "    RssFile {:>8.2} → {:>8.2} MiB (+{:.2})   RssAnon {:>8.2} → {:>8.2} MiB ({:+.2})   RssFile after release {:.2} MiB",
        mib(file_before),
        mib(file_after),
        mib(file_after.saturating_sub(file_before)),
        mib(anon_before),
        mib(anon_after),
        mib(anon_after) - mib(anon_before),
        mib(file_released),
    );
}
