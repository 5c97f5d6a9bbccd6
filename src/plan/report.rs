//! The plan as a table a person reads.

use std::fmt::Write;

use super::Plan;
use super::memory::format_limit;
use crate::geometry::WeightGroup;
use crate::units::format_bytes;

/// Renders `plan` as aligned text, ending with the verdict.
pub fn render(plan: &Plan) -> String {
    let mut out = String::new();
    let h = &plan.host;
    let m = &plan.model;
    let name = m.name.as_deref().unwrap_or(m.architecture.name());
    let _ = writeln!(
        out,
        "sparkrt plan: {name} ({}, {}) on {} [{}]{}",
        m.architecture.name(),
        m.quantization.name(),
        plan.device.name(),
        plan.profile,
        if plan.estimated {
            "  (weights estimated from the geometry)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "  {} layers ({} MoE), {} experts, top-{}, hidden {}, expert intermediate {}",
        m.num_layers,
        m.num_moe_layers,
        m.num_experts,
        m.top_k,
        m.hidden_size,
        m.moe_intermediate_size
    );

    let _ = writeln!(out, "\nServing (where each value came from)");
    let source = |key: &str| plan.sources.get(key).map_or("default", |s| s.name());
    let sv = &plan.serving;
    let kv_cache = match sv.kv_cache {
        super::profile::KvCacheSize::Auto => "auto".to_string(),
        super::profile::KvCacheSize::Bytes(b) => format_bytes(b),
    };
    let serving_rows: [(&str, String); 8] = [
        ("geometry", format!("{} layers", m.num_layers)),
        ("name", m.name.clone().unwrap_or_else(|| "-".to_string())),
        ("max_model_len", sv.max_model_len.to_string()),
        ("max_num_seqs", sv.max_num_seqs.to_string()),
        (
            "max_num_batched_tokens",
            sv.max_num_batched_tokens.to_string(),
        ),
        ("dp_size", sv.dp_size.to_string()),
        ("kv_cache_dtype", sv.kv_cache_dtype.name().to_string()),
        ("kv_cache", kv_cache),
    ];
    for (key, value) in serving_rows {
        let from = source(if key == "geometry" { "model" } else { key });
        let _ = writeln!(out, "  {key:<24}{value:>18}  ({from})");
    }

    let _ = writeln!(out, "\nHost");
    let row = |out: &mut String, label: &str, value: String| {
        let _ = writeln!(out, "  {label:<42}{value:>14}");
    };
    row(&mut out, "MemTotal", format_bytes(h.mem_total));
    row(&mut out, "MemAvailable", format_bytes(h.mem_available));
    row(&mut out, "eviction hard", format_bytes(h.eviction_hard));
    row(&mut out, "OS reserve", format_bytes(h.os_reserve));
    row(&mut out, "safety margin", format_bytes(h.safety_margin));
    if let Some(kube_limit) = h.kube_limit {
        row(
            &mut out,
            "kubelet systemReserved",
            format_bytes(h.system_reserved),
        );
        row(
            &mut out,
            "kubelet kubeReserved",
            format_bytes(h.kube_reserved),
        );
        row(&mut out, "kubepods in use", format_bytes(h.kubepods_in_use));
        row(&mut out, "host limit", format_limit(h.host_limit));
        row(&mut out, "kubelet limit", format_limit(kube_limit));
    } else {
        row(
            &mut out,
            "host limit (no kubelet)",
            format_limit(h.host_limit),
        );
    }
    let binding = match h.binding {
        super::memory::Binding::Host => "host",
        super::memory::Binding::Kubelet => "kubelet",
    };
    row(
        &mut out,
        &format!("usable (bound by {binding})"),
        format_limit(h.usable),
    );

    let _ = writeln!(out, "\nPlan");
    row(&mut out, "weights", format_bytes(plan.weights.total));
    // A served MTP head last (it is not in ALL: planned only when served).
    for group in WeightGroup::ALL.into_iter().chain([WeightGroup::Mtp]) {
        let bytes = plan.weights.groups.get(&group).copied().unwrap_or(0);
        if bytes > 0 {
            row(
                &mut out,
                &format!("  {}", group.name()),
                format_bytes(bytes),
            );
        }
    }
    for (prefix, bytes) in &plan.weights.unused {
        // Mapped, never read: no byte of it is planned.
        row(
            &mut out,
            &format!("  ({prefix}* not used by text serving)"),
            format_bytes(*bytes),
        );
    }
    let ws = &plan.moe_workspace;
    row(
        &mut out,
        &format!("MoE workspace (1 shared, {} tokens)", ws.capacity_tokens),
        format_bytes(ws.bytes),
    );
    for b in &ws.buffers {
        row(&mut out, &format!("  {}", b.name), format_bytes(b.bytes));
    }
    row(
        &mut out,
        &format!("  (one per layer would be ×{})", m.num_moe_layers),
        format_bytes(ws.per_layer_total_bytes),
    );
    row(
        &mut out,
        "activations",
        format_bytes(plan.activations.bytes),
    );
    let pl = &plan.prompt_logprobs;
    row(
        &mut out,
        &format!("  {}: {} prompt rows at once", pl.buffer, pl.chunk_rows),
        format_bytes(pl.chunk_bytes),
    );
    row(
        &mut out,
        &format!(
            "    (all {} at once would be)",
            plan.serving.max_num_batched_tokens
        ),
        format_bytes(pl.unchunked_bytes),
    );
    row(
        &mut out,
        "runtime overhead",
        format_bytes(plan.runtime_overhead.bytes),
    );
    let kv = &plan.kv_cache;
    row(
        &mut out,
        &format!("KV cache ({} tokens, {})", kv.tokens, kv.dtype.name()),
        format_bytes(kv.bytes),
    );
    row(
        &mut out,
        "  bytes per token",
        format!("{}", kv.bytes_per_token),
    );
    if let Some(asked) = kv.capped_from {
        let _ = writeln!(
            out,
            "  (kv_cache = {} capped: max_num_seqs {} × max_model_len {} use at most {} tokens)",
            format_bytes(asked),
            plan.serving.max_num_seqs,
            plan.serving.max_model_len,
            kv.tokens
        );
    }
    if kv.sliding.layers > 0 {
        row(
            &mut out,
            &format!(
                "  sliding layers ({}, window {}: {} blocks)",
                kv.sliding.layers, kv.sliding.window_tokens, kv.sliding.blocks
            ),
            format_bytes(kv.sliding.bytes),
        );
    }
    let state = &plan.recurrent_state;
    if state.bytes > 0 {
        row(
            &mut out,
            &format!(
                "recurrent state ({} layers × {} slots, {})",
                state.layers,
                state.slots,
                state.dtype.name()
            ),
            format_bytes(state.bytes),
        );
        row(
            &mut out,
            &format!("  {} live slots (max_num_seqs)", state.live_slots),
            format_bytes(state.live_slots as u64 * state.bytes_per_seq),
        );
        if state.snapshot_slots > 0 {
            row(
                &mut out,
                &match state.snapshot_interval {
                    0 => format!("  {} prefix-cache snapshots", state.snapshot_slots),
                    every => format!(
                        "  {} prefix-cache snapshots (every {every} prompt tokens)",
                        state.snapshot_slots
                    ),
                },
                format_bytes(state.snapshot_slots as u64 * state.bytes_per_seq),
            );
        }
        if state.verify_slots > 0 {
            row(
                &mut out,
                &format!(
                    "  {} verify slots (max_num_seqs × {} drafts)",
                    state.verify_slots, plan.speculative.num_speculative_tokens
                ),
                format_bytes(plan.speculative.verify_state_bytes),
            );
        }
        row(
            &mut out,
            "  bytes per slot",
            format_bytes(state.bytes_per_seq),
        );
    }
    let spec = &plan.speculative;
    if let Some(method) = spec.method {
        let _ = writeln!(
            out,
            "speculative decoding: {method}, {} drafts per step; the logits buffer holds {} rows (max_num_seqs × (1 + {})): {} of it for the drafts; verify rows run inside max_num_batched_tokens",
            spec.num_speculative_tokens,
            spec.logit_rows,
            spec.num_speculative_tokens,
            format_bytes(spec.logits_bytes)
        );
    }
    row(&mut out, "total", format_bytes(plan.total));
    let q = &plan.queue;
    let _ = writeln!(
        out,
        "queue: {} sequences may wait (default --max-queue): {} of the safety margin ({}) over {} per queued sequence",
        q.max_queue,
        format_bytes(q.budget),
        format_bytes(h.safety_margin),
        format_bytes(q.bytes_per_sequence)
    );

    match &plan.shortfall {
        None => {
            // Fits means total ≤ usable, so neither figure is negative.
            let usable = u64::try_from(h.usable).unwrap_or(0);
            let _ = writeln!(
                out,
                "\nFITS: {} of {} usable, {} to spare.",
                format_bytes(plan.total),
                format_bytes(usable),
                format_bytes(usable.saturating_sub(plan.total))
            );
        }
        Some(short) => {
            let _ = writeln!(
                out,
                "\nDOES NOT FIT: {} short ({}).",
                format_bytes(short.bytes),
                h.usable_phrase()
            );
            for a in &short.advice {
                let _ = writeln!(out, "  - {a}");
            }
        }
    }
    out
}

/// Renders a plan over several ranks: what each holds, each rank against
/// its node, the collectives' traffic, and the verdict (every rank fits, or
/// the first that does not, with its figures and advice).
pub fn render_parallel(plan: &super::parallel::ParallelPlan) -> String {
    let mut out = String::new();
    let Some(first) = plan.ranks.first() else {
        return out;
    };
    let p = &first.plan;
    let m = &p.model;
    let world = plan.tensor_parallel_size;
    let _ = writeln!(
        out,
        "sparkrt plan: {} ({}, {}) on {} [{}], tensor-parallel {world}, experts by id  (weights estimated from the geometry)",
        m.name.as_deref().unwrap_or(m.architecture.name()),
        m.architecture.name(),
        m.quantization.name(),
        p.device.name(),
        p.profile,
    );
    let s = &first.share;
    let mut held = format!(
        "  each rank: {} attention heads, {} KV head{}",
        s.attention_heads,
        s.kv_heads,
        if s.kv_heads == 1 { "" } else { "s" }
    );
    if s.kv_head_copies > 1 {
        let _ = write!(held, " (each held by {} ranks)", s.kv_head_copies);
    }
    if s.linear_value_heads > 0 {
        let _ = write!(
            held,
            ", {} / {} Gated DeltaNet key / value heads",
            s.linear_key_heads, s.linear_value_heads
        );
    }
    if s.intermediate_size > 0 {
        let _ = write!(held, ", {} dense MLP columns", s.intermediate_size);
    }
    if s.shared_expert_intermediate_size > 0 {
        let _ = write!(
            held,
            ", {} shared-expert columns",
            s.shared_expert_intermediate_size
        );
    }
    let _ = writeln!(out, "{held}; norms and the router whole");
    for r in &plan.ranks {
        let _ = writeln!(out, "  rank {} on {}", r.share.rank, r.node);
    }
    let _ = writeln!(
        out,
        "\n  {:<6}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}  {:<11}vocab rows",
        "rank", "usable", "weights", "workspace", "activ.", "KV cache", "state", "total", "experts"
    );
    // Inclusive ranges of ids and rows (`-` where a rank holds none).
    let range = |first: usize, count: usize| match count {
        0 => "-".to_string(),
        n => format!("{first}–{}", first + n - 1),
    };
    for r in &plan.ranks {
        let (p, s) = (&r.plan, &r.share);
        let _ = writeln!(
            out,
            "  {:<6}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}  {:<11}{}",
            s.rank,
            format_limit(p.host.usable),
            format_bytes(p.weights.total),
            format_bytes(p.moe_workspace.bytes),
            format_bytes(p.activations.bytes),
            format_bytes(p.kv_cache.bytes),
            format_bytes(p.recurrent_state.bytes),
            format_bytes(p.total),
            range(s.first_expert, s.experts),
            range(s.first_vocab_row, s.vocab_rows),
        );
    }
    let c = &plan.collectives;
    let _ = writeln!(
        out,
        "\ncollectives per decoded token: {} all-reduces of {} and a logits all-gather of {}: {} sent per rank in {} ring steps",
        c.all_reduces_per_token,
        format_bytes(c.all_reduce_bytes),
        format_bytes(c.all_gather_bytes),
        format_bytes(c.sent_bytes_per_token),
        c.steps_per_token
    );
    if let Some(bound) = c.tokens_per_second_bound {
        let _ = writeln!(
            out,
            "  on paper at {:.0} GB/s and {:.0} µs a step: {:.0} µs a token, so at most {bound:.0} tok/s per sequence from the collectives alone",
            super::parallel::LINK_BYTES_PER_SECOND / 1e9,
            super::parallel::COLLECTIVE_STEP_SECONDS * 1e6,
            c.seconds_per_token * 1e6
        );
    }
    let d = &plan.gb10_decode;
    let _ = writeln!(
        out,
        "batch-1 decode on GB10 nodes, on paper (experts in expectation, so optimistic): a rank reads up to {} of weights a token ({:.1} ms at {:.0} GB/s) plus {:.1} ms of collectives: {:.1} tok/s",
        format_bytes(d.weight_bytes_per_token),
        d.weight_seconds * 1e3,
        d.bandwidth_bytes_per_second / 1e9,
        d.collective_seconds * 1e3,
        d.tokens_per_second
    );
    match plan.first_short() {
        None => {
            let _ = writeln!(
                out,
                "\nFITS on all {world} ranks: {} KV tokens on every rank (the fewest any rank has room for).",
                plan.kv_tokens
            );
        }
        Some(r) => {
            let short = r.plan.shortfall.as_ref().map_or(0, |s| s.bytes);
            let _ = writeln!(
                out,
                "\nDOES NOT FIT: rank {} on {} is {} short ({}; its plan totals {}). No rank allocates until every rank fits.",
                r.share.rank,
                r.node,
                format_bytes(short),
                r.plan.host.usable_phrase(),
                format_bytes(r.plan.total),
            );
            for a in r.plan.shortfall.iter().flat_map(|s| &s.advice) {
                let _ = writeln!(out, "  - {a}");
            }
            let _ = writeln!(
                out,
                "  - or spread the model over more nodes (--tensor-parallel-size)"
            );
        }
    }
    out
}
