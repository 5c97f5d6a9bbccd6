//! The executor: a step plan through the model and the backend into logits
//! rows. It owns the model, its buffers (the plan's activations, MoE
//! workspace and KV cache) and the backend; it decides nothing.

use super::step_plan::StepPlan;
use crate::backend::Backend;
use crate::model::{Buffers, ModelError, Transformer};
use crate::step::StepBatch;

/// Runs planned steps. The engine's one way to a model: tests put a
/// scripted executor here to drive the scheduler and the output stage
/// without one.
pub trait Executor: Send {
    /// Ids the model's logits rows cover.
    fn vocab_size(&self) -> usize;

    /// Whether the model computes on the host's rayon pool
    /// (`Backend::COMPUTES_ON_HOST_POOL`).
    fn computes_on_host_pool(&self) -> bool {
        false
    }

    /// Runs `plan.batch` through the model, handing the logits of
    /// `plan.batch.logit_rows` to `logits` in order (in groups of whole
    /// rows), then makes `plan.kv_copies` and `plan.state_copies`;
    /// `plan.state_restores` come before the forward pass.
    fn execute(
        &mut self,
        plan: &StepPlan,
        logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError>;

    /// Copies recurrent-state slots `(from, to)` in order, after the step's
    /// output was sampled (`plan.state_settles`: speculative decoding's
    /// roll-backs).
    fn copy_states(&mut self, pairs: &[(u32, u32)]) -> Result<(), ModelError>;

    /// Runs the model's MTP head over `batch`, handing the logits of
    /// `batch.logit_rows` to `logits` as [`execute`](Self::execute) does
    /// (see `Transformer::mtp_forward`; `first`: the pass right after the
    /// step, fed its hidden states). Models without a head refuse.
    fn draft(
        &mut self,
        batch: &StepBatch,
        first: bool,
        logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        let _ = (batch, first, logits);
        Err(ModelError::Unsupported(
            "MTP drafts from an executor without a model head".to_string(),
        ))
    }
}

/// The executor of a loaded model.
pub struct ModelExecutor<'w, B: Backend + 'w> {
    backend: &'w B,
    model: Transformer<'w, B>,
    buffers: Buffers<B>,
}

impl<'w, B: Backend + 'w> ModelExecutor<'w, B> {
    pub fn new(backend: &'w B, model: Transformer<'w, B>, buffers: Buffers<B>) -> Self {
        ModelExecutor {
            backend,
            model,
            buffers,
        }
    }
}

impl<'w, B: Backend + 'w> Executor for ModelExecutor<'w, B> {
    fn vocab_size(&self) -> usize {
        self.model.settings.vocab_size
    }

    fn computes_on_host_pool(&self) -> bool {
        B::COMPUTES_ON_HOST_POOL
    }

    fn execute(
        &mut self,
        plan: &StepPlan,
        logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        if !plan.state_restores.is_empty() {
            // Sequences starting from a cached prefix take its state first.
            self.copy_states(&plan.state_restores)?;
        }
        self.model.forward(
            self.backend,
            &plan.batch,
            &mut self.buffers,
            &mut |first, _count, values| logits(first, values),
        )?;
        // The forked choices' copies of their leader's partial blocks,
        // before anything writes to either again.
        if !plan.kv_copies.is_empty() {
            self.backend
                .kv_copy_blocks(&mut self.buffers.kv, &plan.kv_copies)?;
        }
        if !plan.state_copies.is_empty() {
            self.copy_states(&plan.state_copies)?;
        }
        Ok(())
    }

    fn draft(
        &mut self,
        batch: &StepBatch,
        first: bool,
        logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        self.model.mtp_forward(
            self.backend,
            batch,
            first,
            &mut self.buffers,
            &mut |first, _count, values| logits(first, values),
        )
    }

    fn copy_states(&mut self, pairs: &[(u32, u32)]) -> Result<(), ModelError> {
        let Some(state) = self.buffers.state.as_mut() else {
            return Err(ModelError::Unsupported(
                "state slot copies for a model without recurrent state".to_string(),
            ));
        };
        Ok(self.backend.copy_state_slots(state, pairs)?)
    }
}
