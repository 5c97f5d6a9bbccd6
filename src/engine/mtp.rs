//! Drafts from the model's MTP head (`--speculative-config '{"method":
//! "mtp", ...}'`), made right after a step is sampled and before it is
//! applied, so that every row's KV slot is still its sequence's.
//!
//! The head at position `t` reads the target's last hidden state there and
//! the token at `t + 1`, and guesses the token at `t + 2`. Its first pass
//! runs over every row of the step just computed, each fed its sequence's
//! next token where that is known (the prompt's next token, a kept draft,
//! the token just sampled; a row after a rejected draft keeps its own
//! token, and is overwritten later like the target's): so the head's KV
//! layer holds every computed position, and the row of each sequence's
//! last known position gives its first draft. Each further draft is one
//! more pass of a row per sequence, a position later, fed the head's own
//! output and the draft before (vLLM's recursion for k > 1). Drafts are
//! the head's argmax; the engine checks them as any draft (`drafts`). A
//! sequence backing off (`drafts::Backoff`) gets no logits row and no later
//! passes, though its rows still fill the head's KV layer; a pass with no
//! logits row at all computes only the head's keys and values
//! (`Transformer::mtp_forward`).

use super::executor::Executor;
use super::sampling::checked_argmax;
use super::sequence::Sequence;
use super::step_plan::StepPlan;
use crate::model::ModelError;
use crate::step::{Logits, StepBatch};

pub(crate) struct MtpDrafter {
    /// Drafts per sequence and step at most.
    k: usize,
    kv_block_size: usize,
    /// The pass being run (capacity kept between steps).
    batch: StepBatch,
    /// Per drafting sequence, in the pass's row order: its running index,
    /// its batch index in the step and the position of the pass's row.
    rows: Vec<(usize, usize, usize)>,
    /// The pass's drafts, one per row (`None`: its logits were not finite).
    drafted: Vec<Option<u32>>,
}

impl MtpDrafter {
    pub fn new(k: usize, kv_block_size: usize, template: &StepBatch) -> MtpDrafter {
        MtpDrafter {
            k,
            kv_block_size,
            batch: template.clone(),
            rows: Vec::with_capacity(template.seqs.capacity()),
            drafted: Vec::with_capacity(template.seqs.capacity()),
        }
    }

    /// Makes the drafts of the sequences of `plan` that go on decoding into
    /// their `drafts.head`, for their next step.
    pub fn draft(
        &mut self,
        plan: &StepPlan,
        running: &mut [Sequence],
        executor: &mut dyn Executor,
    ) -> Result<(), ModelError> {
        self.first_pass(plan, running);
        for pass in 0..self.k {
            // The first pass runs even without a draft to make: the head's
            // KV layer gets every computed position.
            if pass > 0 && (self.rows.is_empty() || !self.next_pass(plan, running)) {
                break;
            }
            self.drafted.clear();
            let drafted = &mut self.drafted;
            let vocab = executor.vocab_size();
            executor.draft(&self.batch, pass == 0, &mut |_, values| {
                for row in values.chunks_exact(vocab.max(1)) {
                    drafted.push(checked_argmax(row).ok().map(|(token, _)| token));
                }
            })?;
            let mut kept = 0;
            for i in 0..self.rows.len() {
                let (index, _, _) = self.rows[i];
                let seq = &mut running[index];
                match self.drafted.get(i).copied().flatten() {
                    // A chain stays whole: a sequence whose pass gave no
                    // draft leaves the later passes.
                    Some(token) if seq.drafts.head.len() == pass => {
                        seq.drafts.head.push(token);
                        seq.drafts.head_len = seq.tokens.len();
                        kept += 1;
                    }
                    _ => {}
                }
            }
            if kept < self.rows.len() {
                // The next pass's inputs are this pass's outputs row for
                // row: one missing breaks the order.
                break;
            }
        }
        Ok(())
    }

    /// The step's rows with each one's next token, and a logits row for the
    /// last known position of each sequence still decoding.
    fn first_pass(&mut self, plan: &StepPlan, running: &mut [Sequence]) {
        self.batch.clone_from(&plan.batch);
        self.batch.logit_rows.clear();
        self.batch.state_saves.clear();
        self.rows.clear();
        for (b, (chunk, rows)) in plan.chunks.iter().zip(&plan.batch.seqs).enumerate() {
            let seq = &mut running[chunk.seq];
            seq.drafts.head.clear();
            for r in rows.rows() {
                let position = plan.batch.positions[r] as usize;
                if let Some(&next) = seq.tokens.get(position + 1) {
                    self.batch.tokens[r] = next;
                }
            }
            // The position whose next token is the sequence's last: inside
            // the chunk when the step sampled that token.
            let Some(last) = seq.tokens.len().checked_sub(2) else {
                continue;
            };
            let first = rows.past as usize;
            // A sequence backing off drafts nothing next step: no logits row
            // (on a real vocabulary lm_head is a large part of a pass).
            if seq.finished.is_some()
                || !seq.drafts.backoff.next_allows()
                || last < first
                || last >= first + rows.len as usize
            {
                continue;
            }
            let row = rows.start as usize + (last - first);
            self.batch.logit_rows.push(row as u32);
            self.rows.push((chunk.seq, b, last));
        }
    }

    /// The next recursive pass: one row per sequence a position later, fed
    /// its last draft. `false` when a sequence's blocks end before the row
    /// (its lookahead was not reserved): the drafts stop there.
    fn next_pass(&mut self, plan: &StepPlan, running: &[Sequence]) -> bool {
        let step = &plan.batch;
        let fits = self.rows.iter().all(|&(_, b, position)| {
            (step.seqs[b].table_len as usize) * self.kv_block_size > position + 1
        });
        if !fits {
            return false;
        }
        self.batch.clear();
        for row in &mut self.rows {
            let (index, b, position) = *row;
            let Some(&draft) = running[index].drafts.head.last() else {
                return false;
            };
            self.batch.push_seq(
                &[draft],
                position + 1,
                step.table(b),
                step.sliding_table(b),
                Logits::Last,
            );
            let seq_in_pass = self.batch.seqs.len() - 1;
            self.batch
                .set_state_slot(seq_in_pass, step.seqs[b].state_slot);
            row.2 = position + 1;
        }
        true
    }
}
