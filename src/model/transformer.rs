//! The transformer's forward step, written once over [`Backend`]: every
//! layer's mixer and MLP over a step's rows, then the sampled rows' logits.

use super::buffers::Buffers;
use super::error::ModelError;
use super::layers::{
    Attention, DeltaNet, DeltaNetInput, Layer, Mixer, Mlp, ModelSettings, MtpHead,
};
use crate::backend::{Backend, DeltaRuleGates, Matmul};
use crate::step::StepBatch;

pub struct Transformer<'w, B: Backend + 'w> {
    pub settings: ModelSettings,
    pub embed: B::Linear<'w>,
    pub layers: Vec<Layer<'w, B>>,
    pub norm: B::Vector<'w>,
    pub lm_head: B::Linear<'w>,
    /// The MTP head, when speculative decoding drafts with it.
    pub mtp: Option<MtpHead<'w, B>>,
}

impl<'w, B: Backend + 'w> Transformer<'w, B> {
    /// Runs one step: every layer over `batch`'s rows, then the logits of
    /// `batch.logit_rows`, handed to `on_logits(first, count, values)` in
    /// groups of at most `max_num_seqs` rows (`count × vocab` values).
    pub fn forward(
        &self,
        b: &B,
        batch: &StepBatch,
        st: &mut Buffers<B>,
        on_logits: &mut dyn FnMut(usize, usize, &[f32]),
    ) -> Result<(), ModelError> {
        let Some(rows) = self.load_step(b, batch, st)? else {
            return Ok(());
        };
        let (h, eps) = (self.settings.hidden_size, self.settings.rms_norm_eps);
        b.embed(&self.embed, &st.step, &mut st.hidden)?;

        for (index, layer) in self.layers.iter().enumerate() {
            self.block(b, layer, index == 0, rows, st)?;
        }
        b.add_rmsnorm(
            &mut st.hidden,
            &st.block_out,
            &self.norm,
            eps,
            rows,
            h,
            &mut st.normed,
        )?;
        if let (Some(_), Some(mtp)) = (&self.mtp, st.mtp.as_mut()) {
            // The MTP head's first pass reads every row's last hidden state
            // (after the final norm, what lm_head reads): the same norm
            // again into its own buffer, before `normed` is compacted.
            b.rmsnorm(&st.hidden, &self.norm, eps, rows, h, &mut mtp.hidden)?;
        }
        self.logits(b, batch, st, on_logits)
    }

    /// Runs the MTP head over `batch` (its tokens: each row's next token),
    /// then the logits of `batch.logit_rows` as [`forward`](Self::forward)
    /// hands them. `first`: the head reads the target's last hidden states
    /// of the step [`forward`](Self::forward) just ran, row for row (the
    /// batch has that step's rows); otherwise the head's own outputs of the
    /// pass before, one row per logits row of that pass (a recursive draft).
    /// The head's layer attends over, and appends to, the last KV layer.
    pub fn mtp_forward(
        &self,
        b: &B,
        batch: &StepBatch,
        first: bool,
        st: &mut Buffers<B>,
        on_logits: &mut dyn FnMut(usize, usize, &[f32]),
    ) -> Result<(), ModelError> {
        let Some(head) = &self.mtp else {
            return Err(ModelError::Unsupported(
                "an MTP pass for a model loaded without its MTP head".to_string(),
            ));
        };
        let Some(rows) = self.load_step(b, batch, st)? else {
            return Ok(());
        };
        let (h, eps) = (self.settings.hidden_size, self.settings.rms_norm_eps);
        {
            let Some(mtp) = st.mtp.as_mut() else {
                return Err(missing_buffers("the MTP head"));
            };
            // fc([embedding_norm(embed(next token)) | hidden_norm(hidden)]).
            b.embed(&self.embed, &st.step, &mut st.hidden)?;
            b.rmsnorm(
                &st.hidden,
                &head.embedding_norm,
                eps,
                rows,
                h,
                &mut st.block_out,
            )?;
            let source = if first { &mtp.hidden } else { &st.normed };
            b.rmsnorm(source, &head.hidden_norm, eps, rows, h, &mut st.hidden)?;
            b.concat_rows(&st.block_out, &st.hidden, rows, h, &mut mtp.input)?;
            b.matmul(&mut [Matmul {
                x: &mtp.input,
                x_row: 0,
                rows,
                w: &head.fc,
                bias: None,
                out: &mut st.hidden,
            }])?;
        }
        if batch.logit_rows.is_empty() {
            // No row wants a draft (every sequence backing off): the head's
            // KV layer still needs each position, and nothing else of the
            // layer is read later, so only keys and values are computed.
            return self.head_keys_and_values(b, &head.layer, rows, st);
        }
        self.block(b, &head.layer, true, rows, st)?;
        b.add_rmsnorm(
            &mut st.hidden,
            &st.block_out,
            &head.norm,
            eps,
            rows,
            h,
            &mut st.normed,
        )?;
        // `normed` keeps the logits rows' outputs (compacted): the next
        // pass's hidden states.
        self.logits(b, batch, st, on_logits)
    }

    /// Checks `batch` against the buffers and loads its positions, slots
    /// and rotary table; its rows, `None` when it has none.
    fn load_step(
        &self,
        b: &B,
        batch: &StepBatch,
        st: &mut Buffers<B>,
    ) -> Result<Option<usize>, ModelError> {
        let rows = batch.rows();
        if rows > st.max_rows || batch.seqs.len() > st.max_seqs {
            return Err(ModelError::StepTooLarge {
                rows,
                seqs: batch.seqs.len(),
                max_rows: st.max_rows,
                max_seqs: st.max_seqs,
            });
        }
        if rows == 0 {
            return Ok(None);
        }
        let rope = &self.settings.rope;
        b.load_step(batch, &mut st.step)?;
        b.rope_table(
            &st.step,
            &rope.inv_freq,
            rope.attention_factor,
            rows,
            &mut st.rope,
        )?;
        Ok(Some(rows))
    }

    /// One decoder block over `rows`: its mixer and MLP, their outputs
    /// joining the residual `hidden` (the MLP's left in `block_out` for the
    /// next block's norm). `first`: nothing is pending in `block_out`.
    fn block(
        &self,
        b: &B,
        layer: &Layer<'w, B>,
        first: bool,
        rows: usize,
        st: &mut Buffers<B>,
    ) -> Result<(), ModelError> {
        let (h, eps) = (self.settings.hidden_size, self.settings.rms_norm_eps);
        // The previous layer's MLP output joins the residual here.
        if first {
            b.rmsnorm(&st.hidden, &layer.input_norm, eps, rows, h, &mut st.normed)?;
        } else {
            b.add_rmsnorm(
                &mut st.hidden,
                &st.block_out,
                &layer.input_norm,
                eps,
                rows,
                h,
                &mut st.normed,
            )?;
        }
        match &layer.mixer {
            Mixer::Attention {
                attention,
                kv_layer,
            } => self.attention(b, *kv_layer, attention, rows, st)?,
            Mixer::DeltaNet(net) => self.delta_net(b, net, rows, st)?,
        }
        b.add_rmsnorm(
            &mut st.hidden,
            &st.block_out,
            &layer.post_attention_norm,
            eps,
            rows,
            h,
            &mut st.normed,
        )?;
        self.mlp(b, layer, rows, st)
    }

    /// The logits of `batch.logit_rows` from the final norm's output in
    /// `normed` (compacted to those rows first).
    fn logits(
        &self,
        b: &B,
        batch: &StepBatch,
        st: &mut Buffers<B>,
        on_logits: &mut dyn FnMut(usize, usize, &[f32]),
    ) -> Result<(), ModelError> {
        let s = &self.settings;
        let h = s.hidden_size;
        // Logits only for the rows that are sampled (or asked for): up to
        // `logit_rows` (max_num_seqs × (1 + drafts)) at a time in `logits`, or, when prompt rows are
        // asked for too, in the planned `prompt_logits` chunk buffer.
        b.compact_rows(&mut st.normed, &st.step, h)?;
        let wanted = batch.logit_rows.len();
        let (out, chunk) = match &mut st.prompt_logits {
            Some(buffer) if wanted > st.logit_rows => (buffer, st.prompt_logit_rows),
            _ => (&mut st.logits, st.logit_rows),
        };
        let mut first = 0;
        while first < wanted {
            let count = (wanted - first).min(chunk);
            b.matmul(&mut [Matmul {
                x: &st.normed,
                x_row: first,
                rows: count,
                w: &self.lm_head,
                bias: None,
                out: &mut *out,
            }])?;
            b.read(out, count * s.vocab_size, &mut |values| {
                on_logits(first, count, values)
            })?;
            first += count;
        }
        Ok(())
    }

    /// The MTP head's layer for a pass without logits: its input norm,
    /// then only what its KV layer keeps, the keys and values of `rows`
    /// (as [`Transformer::attention`] computes and appends them; the
    /// append rounds them to the cache's precision as attention would).
    /// At Qwen3.6's shape that reads `k_proj` and `v_proj`, 4 MB, where
    /// the whole layer reads ~110 MB (its experts, `q_proj`, `o_proj`).
    fn head_keys_and_values(
        &self,
        b: &B,
        layer: &Layer<'w, B>,
        rows: usize,
        st: &mut Buffers<B>,
    ) -> Result<(), ModelError> {
        let Mixer::Attention {
            attention: layer_attention,
            kv_layer,
        } = &layer.mixer
        else {
            return Err(ModelError::Unsupported(
                "an MTP head whose layer is not attention".to_string(),
            ));
        };
        let (h, eps) = (self.settings.hidden_size, self.settings.rms_norm_eps);
        b.rmsnorm(&st.hidden, &layer.input_norm, eps, rows, h, &mut st.normed)?;
        b.matmul(&mut key_value_matmuls(
            layer_attention,
            &st.normed,
            rows,
            &mut st.k,
            &mut st.v,
        ))?;
        let norms = layer_attention
            .qk_norm
            .as_ref()
            .map(|(qn, kn)| (qn, kn, eps));
        // The queries' norm and rotation run too (the op takes both); they
        // are never read.
        b.qk_norm_rope(
            &mut st.q,
            &mut st.k,
            norms,
            &st.rope,
            rows,
            &layer_attention.shape,
        )?;
        b.kv_append(&st.k, &st.v, &mut st.kv, *kv_layer, &st.step)?;
        Ok(())
    }

    fn attention(
        &self,
        b: &B,
        index: usize,
        layer: &Attention<'w, B>,
        rows: usize,
        st: &mut Buffers<B>,
    ) -> Result<(), ModelError> {
        let bias = |i: usize| layer.qkvo_bias.as_ref().map(|biases| &biases[i]);
        // A gated layer's q_proj writes query and gate, split below.
        let query_out = match (layer.output_gate, st.hybrid.as_mut()) {
            (false, _) => &mut st.q,
            (true, Some(h)) => &mut h.query_gate,
            (true, None) => return Err(missing_buffers("gated attention")),
        };
        let [k, v] = key_value_matmuls(layer, &st.normed, rows, &mut st.k, &mut st.v);
        b.matmul(&mut [
            Matmul {
                x: &st.normed,
                x_row: 0,
                rows,
                w: &layer.q,
                bias: bias(0),
                out: query_out,
            },
            k,
            v,
        ])?;
        let shape = &layer.shape;
        if layer.output_gate
            && let Some(h) = st.hybrid.as_mut()
        {
            b.split_query_gate(
                &h.query_gate,
                rows,
                shape.heads,
                shape.head_dim,
                &mut st.q,
                &mut h.attention_gate,
            )?;
        }
        let norms = layer
            .qk_norm
            .as_ref()
            .map(|(qn, kn)| (qn, kn, self.settings.rms_norm_eps));
        b.qk_norm_rope(&mut st.q, &mut st.k, norms, &st.rope, rows, shape)?;
        b.attention(
            &st.q,
            &mut st.k,
            &mut st.v,
            &st.kv,
            index,
            &st.step,
            shape,
            layer.sinks.as_ref(),
            &mut st.workspace,
            &mut st.attn_out,
        )?;
        b.kv_append(&st.k, &st.v, &mut st.kv, index, &st.step)?;
        if layer.output_gate
            && let Some(h) = st.hybrid.as_ref()
        {
            let n = rows * shape.heads * shape.head_dim;
            b.sigmoid_mul(&mut st.attn_out, &h.attention_gate, n)?;
        }
        b.matmul(&mut [Matmul {
            x: &st.attn_out,
            x_row: 0,
            rows,
            w: &layer.o,
            bias: bias(3),
            out: &mut st.block_out,
        }])?;
        Ok(())
    }

    /// A Gated DeltaNet block: input projections, causal convolution, the
    /// gated delta rule over the sequence's recurrent state, the gated
    /// output norm and `out_proj` into `block_out`.
    fn delta_net(
        &self,
        b: &B,
        net: &DeltaNet<'w, B>,
        rows: usize,
        st: &mut Buffers<B>,
    ) -> Result<(), ModelError> {
        let (Some(h), Some(state)) = (st.hybrid.as_mut(), st.state.as_mut()) else {
            return Err(missing_buffers("a Gated DeltaNet layer"));
        };
        let shape = &net.shape;
        let x = &st.normed;
        let job = |w, out| Matmul {
            x,
            x_row: 0,
            rows,
            w,
            bias: None,
            out,
        };
        match &net.input {
            DeltaNetInput::Split { qkv, z, b: beta, a } => b.matmul(&mut [
                job(qkv, &mut h.gdn_qkv),
                job(z, &mut h.gdn_z),
                job(beta, &mut h.gdn_b),
                job(a, &mut h.gdn_a),
            ])?,
            DeltaNetInput::Fused { qkvz, ba } => {
                let (Some(fused_qkvz), Some(fused_ba)) = (h.gdn_qkvz.as_mut(), h.gdn_ba.as_mut())
                else {
                    return Err(missing_buffers("fused Gated DeltaNet projections"));
                };
                b.matmul(&mut [job(qkvz, fused_qkvz), job(ba, fused_ba)])?;
                b.gdn_unfuse(
                    fused_qkvz,
                    fused_ba,
                    rows,
                    shape,
                    &mut h.gdn_qkv,
                    &mut h.gdn_z,
                    &mut h.gdn_b,
                    &mut h.gdn_a,
                )?;
            }
        }
        b.gdn_conv(
            &mut h.gdn_qkv,
            &net.conv,
            state,
            net.state_layer,
            &st.step,
            shape,
        )?;
        let gates = DeltaRuleGates {
            b: &h.gdn_b,
            a: &h.gdn_a,
            a_log: &net.a_log,
            dt_bias: &net.dt_bias,
        };
        b.gdn_delta_rule(
            &mut h.gdn_qkv,
            &gates,
            state,
            net.state_layer,
            &st.step,
            shape,
            &mut h.gdn_out,
        )?;
        b.gated_rmsnorm(
            &mut h.gdn_out,
            &h.gdn_z,
            &net.norm,
            self.settings.rms_norm_eps,
            shape.value_dim,
            rows * shape.value_width(),
        )?;
        b.matmul(&mut [Matmul {
            x: &h.gdn_out,
            x_row: 0,
            rows,
            w: &net.out_proj,
            bias: None,
            out: &mut st.block_out,
        }])?;
        Ok(())
    }

    fn mlp(
        &self,
        b: &B,
        layer: &Layer<'w, B>,
        rows: usize,
        st: &mut Buffers<B>,
    ) -> Result<(), ModelError> {
        let s = &self.settings;
        match &layer.mlp {
            Mlp::Moe {
                router,
                router_bias,
                experts,
                shared,
            } => {
                let router_job = Matmul {
                    x: &st.normed,
                    x_row: 0,
                    rows,
                    w: router,
                    bias: router_bias.as_ref(),
                    out: &mut st.router_logits,
                };
                match (shared, st.shared.as_mut()) {
                    (None, _) => b.matmul(&mut [router_job])?,
                    // The shared expert's projections and gate in the
                    // router's launch.
                    (Some(e), Some(sb)) => {
                        let job = |w, out| Matmul {
                            x: &st.normed,
                            x_row: 0,
                            rows,
                            w,
                            bias: None,
                            out,
                        };
                        b.matmul(&mut [
                            router_job,
                            job(&e.gate, &mut sb.gate_logit),
                            job(&e.gate_proj, &mut sb.gate_proj),
                            job(&e.up_proj, &mut sb.up_proj),
                        ])?;
                    }
                    (Some(_), None) => return Err(missing_buffers("a shared expert")),
                }
                b.route(
                    &st.router_logits,
                    rows,
                    s.num_experts,
                    s.top_k,
                    s.router,
                    &mut st.workspace,
                )?;
                b.moe(
                    &st.normed,
                    rows,
                    experts,
                    &mut st.workspace,
                    &mut st.block_out,
                )?;
                if let (Some(e), Some(sb)) = (shared, st.shared.as_mut()) {
                    b.silu_mul(&mut sb.gate_proj, &sb.up_proj, rows * e.intermediate_size)?;
                    b.matmul(&mut [Matmul {
                        x: &sb.gate_proj,
                        x_row: 0,
                        rows,
                        w: &e.down_proj,
                        bias: None,
                        out: &mut sb.output,
                    }])?;
                    b.add_gated(
                        &mut st.block_out,
                        &sb.output,
                        &sb.gate_logit,
                        rows,
                        s.hidden_size,
                    )?;
                }
            }
            Mlp::Dense { gate, up, down } => {
                let (Some(gate_out), Some(up_out)) = (st.dense_gate.as_mut(), st.dense_up.as_mut())
                else {
                    return Err(ModelError::Unsupported(
                        "a dense MLP layer without planned dense buffers".to_string(),
                    ));
                };
                b.matmul(&mut [
                    Matmul {
                        x: &st.normed,
                        x_row: 0,
                        rows,
                        w: gate,
                        bias: None,
                        out: gate_out,
                    },
                    Matmul {
                        x: &st.normed,
                        x_row: 0,
                        rows,
                        w: up,
                        bias: None,
                        out: up_out,
                    },
                ])?;
                b.silu_mul(gate_out, up_out, rows * s.intermediate_size)?;
                b.matmul(&mut [Matmul {
                    x: gate_out,
                    x_row: 0,
                    rows,
                    w: down,
                    bias: None,
                    out: &mut st.block_out,
                }])?;
            }
        }
        Ok(())
    }
}

/// The key and value projections of attention `layer` over `rows` of
/// `normed` (into `k` and `v`): a layer's attention and the MTP head's
/// keys-and-values pass run the same two.
fn key_value_matmuls<'a, 'w, B: Backend + 'w>(
    layer: &'a Attention<'w, B>,
    normed: &'a B::Buffer,
    rows: usize,
    k: &'a mut B::Buffer,
    v: &'a mut B::Buffer,
) -> [Matmul<'a, 'w, B>; 2] {
    let bias = |i: usize| layer.qkvo_bias.as_ref().map(|biases| &biases[i]);
    [
        Matmul {
            x: normed,
            x_row: 0,
            rows,
            w: &layer.k,
            bias: bias(1),
            out: k,
        },
        Matmul {
            x: normed,
            x_row: 0,
            rows,
            w: &layer.v,
            bias: bias(2),
            out: v,
        },
    ]
}

fn missing_buffers(what: &str) -> ModelError {
    ModelError::Unsupported(format!("{what} without its planned buffers"))
}
