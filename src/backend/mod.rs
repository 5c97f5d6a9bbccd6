//! The compute interface the model is written against, once, for every
//! backend: the CPU (`cpu/`, SIMD + rayon) and CUDA (`cuda/`, NVRTC kernels).
//!
//! A backend owns its memory. Every buffer it allocates is charged to the
//! ledger at allocation time, in the plan's categories, and all of them are
//! allocated once at start-up: nothing in a forward step allocates.
//!
//! Ops take explicit sizes (`rows` = tokens of this step) and write into
//! caller-provided buffers that were sized for `max_num_batched_tokens`.
//!
//! The backend is chosen once, where the program is assembled
//! (`runtime::LoadedModel`); the model, the engine and the commands are
//! generic over `B: Backend`, so one backend's buffers never reach another.

mod charges;
pub mod cpu;
pub mod cuda;
mod error;
mod experts;
mod interface;
mod shapes;

/// The recurrent-state pool as the plan sizes it.
pub use crate::plan::memory::RecurrentStatePlan;
/// The plan's KV layout and step metadata, which the backends allocate.
pub use crate::plan::memory::{KvLayout, StepMetadataPlan};
pub use charges::f32_bytes;
pub use error::BackendError;
pub use experts::{ExpertActivation, ExpertsSpec, GateUp, RouterKind};
pub use interface::{Backend, BufferMemory, DeltaRuleGates, Matmul};
pub use shapes::{AttentionShape, DeltaNetShape};
