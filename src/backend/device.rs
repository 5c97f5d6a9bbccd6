//! The backend chosen at start-up (`[backend] device` / `--backend`): the
//! CPU or CUDA behind one [`Backend`], so the engine, the server and the
//! commands are written once. Each op forwards to the chosen backend; the
//! buffers and weights it is given are that backend's (mixing them is a
//! bug, reported as an error).

use super::cpu::{CpuBackend, CpuBuffer, CpuExperts, CpuKvCache, CpuStep, CpuWorkspace};
use super::cuda::{
    CudaBackend, CudaBuffer, CudaExperts, CudaKvCache, CudaLinear, CudaStep, CudaVector,
    CudaWorkspace,
};
use super::{AttentionShape, Backend, BackendError, ExpertsSpec, KvLayout, Matmul, RouterKind};
use crate::checkpoint::linear::{LinearWeight, VectorWeight};
use crate::plan::ledger::Category;
use crate::plan::memory::MoeWorkspace as MoeWorkspacePlan;
use crate::step::StepBatch;

pub enum DeviceBackend {
    Cpu(CpuBackend),
    Cuda(Box<CudaBackend>),
}

pub enum DeviceBuffer {
    Cpu(CpuBuffer),
    Cuda(CudaBuffer),
}

pub enum DeviceLinear<'w> {
    Cpu(LinearWeight<'w>),
    Cuda(CudaLinear<'w>),
}

pub enum DeviceVector<'w> {
    Cpu(VectorWeight<'w>),
    Cuda(CudaVector<'w>),
}

pub enum DeviceExperts<'w> {
    Cpu(CpuExperts<'w>),
    Cuda(CudaExperts<'w>),
}

pub enum DeviceWorkspace {
    Cpu(CpuWorkspace),
    Cuda(CudaWorkspace),
}

pub enum DeviceKvCache {
    Cpu(CpuKvCache),
    Cuda(CudaKvCache),
}

pub enum DeviceStep {
    Cpu(CpuStep),
    Cuda(CudaStep),
}

fn mismatch() -> BackendError {
    BackendError::Shape("a CPU value given to the CUDA backend or the reverse".to_string())
}

/// `cpu()` / `cuda()` (and `_mut`) accessors of a two-sided enum.
macro_rules! sides {
    ($name:ident $(<$lt:lifetime>)?, $cpu:ty, $cuda:ty) => {
        #[allow(dead_code)]
        impl$(<$lt>)? $name$(<$lt>)? {
            fn cpu(&self) -> Result<&$cpu, BackendError> {
                match self {
                    Self::Cpu(x) => Ok(x),
                    Self::Cuda(_) => Err(mismatch()),
                }
            }
            fn cuda(&self) -> Result<&$cuda, BackendError> {
                match self {
                    Self::Cuda(x) => Ok(x),
                    Self::Cpu(_) => Err(mismatch()),
                }
            }
            fn cpu_mut(&mut self) -> Result<&mut $cpu, BackendError> {
                match self {
                    Self::Cpu(x) => Ok(x),
                    Self::Cuda(_) => Err(mismatch()),
                }
            }
            fn cuda_mut(&mut self) -> Result<&mut $cuda, BackendError> {
                match self {
                    Self::Cuda(x) => Ok(x),
                    Self::Cpu(_) => Err(mismatch()),
                }
            }
        }
    };
}

sides!(DeviceBuffer, CpuBuffer, CudaBuffer);
sides!(DeviceLinear<'w>, LinearWeight<'w>, CudaLinear<'w>);
sides!(DeviceVector<'w>, VectorWeight<'w>, CudaVector<'w>);
sides!(DeviceExperts<'w>, CpuExperts<'w>, CudaExperts<'w>);
sides!(DeviceWorkspace, CpuWorkspace, CudaWorkspace);
sides!(DeviceKvCache, CpuKvCache, CudaKvCache);
sides!(DeviceStep, CpuStep, CudaStep);

/// An optional vector's side.
fn cpu_opt<'a, 'w>(
    v: Option<&'a DeviceVector<'w>>,
) -> Result<Option<&'a VectorWeight<'w>>, BackendError> {
    v.map(|v| v.cpu()).transpose()
}

fn cuda_opt<'a, 'w>(
    v: Option<&'a DeviceVector<'w>>,
) -> Result<Option<&'a CudaVector<'w>>, BackendError> {
    v.map(|v| v.cuda()).transpose()
}

impl DeviceBackend {
    pub fn cuda(&self) -> Option<&CudaBackend> {
        match self {
            DeviceBackend::Cuda(b) => Some(b),
            DeviceBackend::Cpu(_) => None,
        }
    }
}

impl Backend for DeviceBackend {
    type Buffer = DeviceBuffer;
    type Linear<'w> = DeviceLinear<'w>;
    type Vector<'w> = DeviceVector<'w>;
    type Experts<'w> = DeviceExperts<'w>;
    type Workspace = DeviceWorkspace;
    type KvCache = DeviceKvCache;
    type Step = DeviceStep;

    fn name(&self) -> &'static str {
        match self {
            DeviceBackend::Cpu(b) => b.name(),
            DeviceBackend::Cuda(b) => b.name(),
        }
    }

    fn alloc(
        &self,
        category: Category,
        what: &'static str,
        elements: usize,
    ) -> Result<DeviceBuffer, BackendError> {
        Ok(match self {
            DeviceBackend::Cpu(b) => DeviceBuffer::Cpu(b.alloc(category, what, elements)?),
            DeviceBackend::Cuda(b) => DeviceBuffer::Cuda(b.alloc(category, what, elements)?),
        })
    }

    fn linear<'w>(&self, w: LinearWeight<'w>) -> Result<DeviceLinear<'w>, BackendError> {
        Ok(match self {
            DeviceBackend::Cpu(b) => DeviceLinear::Cpu(b.linear(w)?),
            DeviceBackend::Cuda(b) => DeviceLinear::Cuda(b.linear(w)?),
        })
    }

    fn vector<'w>(&self, v: VectorWeight<'w>) -> Result<DeviceVector<'w>, BackendError> {
        Ok(match self {
            DeviceBackend::Cpu(b) => DeviceVector::Cpu(b.vector(v)?),
            DeviceBackend::Cuda(b) => DeviceVector::Cuda(b.vector(v)?),
        })
    }

    fn experts<'w>(&self, spec: ExpertsSpec<'w>) -> Result<DeviceExperts<'w>, BackendError> {
        Ok(match self {
            DeviceBackend::Cpu(b) => DeviceExperts::Cpu(b.experts(spec)?),
            DeviceBackend::Cuda(b) => DeviceExperts::Cuda(b.experts(spec)?),
        })
    }

    fn workspace(&self, plan: &MoeWorkspacePlan) -> Result<DeviceWorkspace, BackendError> {
        Ok(match self {
            DeviceBackend::Cpu(b) => DeviceWorkspace::Cpu(b.workspace(plan)?),
            DeviceBackend::Cuda(b) => DeviceWorkspace::Cuda(b.workspace(plan)?),
        })
    }

    fn kv_cache(&self, layout: &KvLayout, layers: usize) -> Result<DeviceKvCache, BackendError> {
        Ok(match self {
            DeviceBackend::Cpu(b) => DeviceKvCache::Cpu(b.kv_cache(layout, layers)?),
            DeviceBackend::Cuda(b) => DeviceKvCache::Cuda(b.kv_cache(layout, layers)?),
        })
    }

    fn step_storage(
        &self,
        max_tokens: usize,
        max_seqs: usize,
        max_blocks_per_seq: usize,
    ) -> Result<DeviceStep, BackendError> {
        Ok(match self {
            DeviceBackend::Cpu(b) => {
                DeviceStep::Cpu(b.step_storage(max_tokens, max_seqs, max_blocks_per_seq)?)
            }
            DeviceBackend::Cuda(b) => {
                DeviceStep::Cuda(b.step_storage(max_tokens, max_seqs, max_blocks_per_seq)?)
            }
        })
    }

    fn load_step(&self, batch: &StepBatch, step: &mut DeviceStep) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cpu(b) => b.load_step(batch, step.cpu_mut()?),
            DeviceBackend::Cuda(b) => b.load_step(batch, step.cuda_mut()?),
        }
    }

    fn embed(
        &self,
        table: &DeviceLinear<'_>,
        step: &DeviceStep,
        out: &mut DeviceBuffer,
    ) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cpu(b) => b.embed(table.cpu()?, step.cpu()?, out.cpu_mut()?),
            DeviceBackend::Cuda(b) => b.embed(table.cuda()?, step.cuda()?, out.cuda_mut()?),
        }
    }

    fn rmsnorm(
        &self,
        x: &DeviceBuffer,
        w: &DeviceVector<'_>,
        eps: f32,
        rows: usize,
        width: usize,
        out: &mut DeviceBuffer,
    ) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cpu(b) => {
                b.rmsnorm(x.cpu()?, w.cpu()?, eps, rows, width, out.cpu_mut()?)
            }
            DeviceBackend::Cuda(b) => {
                b.rmsnorm(x.cuda()?, w.cuda()?, eps, rows, width, out.cuda_mut()?)
            }
        }
    }

    fn add_rmsnorm(
        &self,
        residual: &mut DeviceBuffer,
        delta: &DeviceBuffer,
        w: &DeviceVector<'_>,
        eps: f32,
        rows: usize,
        width: usize,
        out: &mut DeviceBuffer,
    ) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cpu(b) => b.add_rmsnorm(
                residual.cpu_mut()?,
                delta.cpu()?,
                w.cpu()?,
                eps,
                rows,
                width,
                out.cpu_mut()?,
            ),
            DeviceBackend::Cuda(b) => b.add_rmsnorm(
                residual.cuda_mut()?,
                delta.cuda()?,
                w.cuda()?,
                eps,
                rows,
                width,
                out.cuda_mut()?,
            ),
        }
    }

    fn matmul(&self, jobs: &mut [Matmul<'_, '_, Self>]) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cpu(b) => {
                let mut side = Vec::with_capacity(jobs.len());
                for job in jobs.iter_mut() {
                    side.push(Matmul {
                        x: job.x.cpu()?,
                        x_row: job.x_row,
                        rows: job.rows,
                        w: job.w.cpu()?,
                        bias: cpu_opt(job.bias)?,
                        out: job.out.cpu_mut()?,
                    });
                }
                b.matmul(&mut side)
            }
            DeviceBackend::Cuda(b) => {
                let mut side = Vec::with_capacity(jobs.len());
                for job in jobs.iter_mut() {
                    side.push(Matmul {
                        x: job.x.cuda()?,
                        x_row: job.x_row,
                        rows: job.rows,
                        w: job.w.cuda()?,
                        bias: cuda_opt(job.bias)?,
                        out: job.out.cuda_mut()?,
                    });
                }
                b.matmul(&mut side)
            }
        }
    }

    fn rope_table(
        &self,
        step: &DeviceStep,
        inv_freq: &[f32],
        attention_factor: f32,
        rows: usize,
        out: &mut DeviceBuffer,
    ) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cpu(b) => b.rope_table(
                step.cpu()?,
                inv_freq,
                attention_factor,
                rows,
                out.cpu_mut()?,
            ),
            DeviceBackend::Cuda(b) => b.rope_table(
                step.cuda()?,
                inv_freq,
                attention_factor,
                rows,
                out.cuda_mut()?,
            ),
        }
    }

    fn qk_norm_rope(
        &self,
        q: &mut DeviceBuffer,
        k: &mut DeviceBuffer,
        norms: Option<(&DeviceVector<'_>, &DeviceVector<'_>, f32)>,
        rope: &DeviceBuffer,
        rows: usize,
        shape: &AttentionShape,
    ) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cpu(b) => {
                let norms = match norms {
                    Some((qn, kn, eps)) => Some((qn.cpu()?, kn.cpu()?, eps)),
                    None => None,
                };
                b.qk_norm_rope(q.cpu_mut()?, k.cpu_mut()?, norms, rope.cpu()?, rows, shape)
            }
            DeviceBackend::Cuda(b) => {
                let norms = match norms {
                    Some((qn, kn, eps)) => Some((qn.cuda()?, kn.cuda()?, eps)),
                    None => None,
                };
                b.qk_norm_rope(
                    q.cuda_mut()?,
                    k.cuda_mut()?,
                    norms,
                    rope.cuda()?,
                    rows,
                    shape,
                )
            }
        }
    }

    fn attention(
        &self,
        q: &DeviceBuffer,
        k: &mut DeviceBuffer,
        v: &mut DeviceBuffer,
        kv: &DeviceKvCache,
        layer: usize,
        step: &DeviceStep,
        shape: &AttentionShape,
        sinks: Option<&DeviceVector<'_>>,
        ws: &mut DeviceWorkspace,
        out: &mut DeviceBuffer,
    ) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cpu(b) => b.attention(
                q.cpu()?,
                k.cpu_mut()?,
                v.cpu_mut()?,
                kv.cpu()?,
                layer,
                step.cpu()?,
                shape,
                cpu_opt(sinks)?,
                ws.cpu_mut()?,
                out.cpu_mut()?,
            ),
            DeviceBackend::Cuda(b) => b.attention(
                q.cuda()?,
                k.cuda_mut()?,
                v.cuda_mut()?,
                kv.cuda()?,
                layer,
                step.cuda()?,
                shape,
                cuda_opt(sinks)?,
                ws.cuda_mut()?,
                out.cuda_mut()?,
            ),
        }
    }

    fn kv_append(
        &self,
        k: &DeviceBuffer,
        v: &DeviceBuffer,
        kv: &mut DeviceKvCache,
        layer: usize,
        step: &DeviceStep,
    ) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cpu(b) => {
                b.kv_append(k.cpu()?, v.cpu()?, kv.cpu_mut()?, layer, step.cpu()?)
            }
            DeviceBackend::Cuda(b) => {
                b.kv_append(k.cuda()?, v.cuda()?, kv.cuda_mut()?, layer, step.cuda()?)
            }
        }
    }

    fn route(
        &self,
        logits: &DeviceBuffer,
        rows: usize,
        num_experts: usize,
        top_k: usize,
        kind: RouterKind,
        ws: &mut DeviceWorkspace,
    ) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cpu(b) => {
                b.route(logits.cpu()?, rows, num_experts, top_k, kind, ws.cpu_mut()?)
            }
            DeviceBackend::Cuda(b) => b.route(
                logits.cuda()?,
                rows,
                num_experts,
                top_k,
                kind,
                ws.cuda_mut()?,
            ),
        }
    }

    fn moe(
        &self,
        x: &DeviceBuffer,
        rows: usize,
        experts: &DeviceExperts<'_>,
        ws: &mut DeviceWorkspace,
        out: &mut DeviceBuffer,
    ) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cpu(b) => b.moe(
                x.cpu()?,
                rows,
                experts.cpu()?,
                ws.cpu_mut()?,
                out.cpu_mut()?,
            ),
            DeviceBackend::Cuda(b) => b.moe(
                x.cuda()?,
                rows,
                experts.cuda()?,
                ws.cuda_mut()?,
                out.cuda_mut()?,
            ),
        }
    }

    fn silu_mul(
        &self,
        gate: &mut DeviceBuffer,
        up: &DeviceBuffer,
        n: usize,
    ) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cpu(b) => b.silu_mul(gate.cpu_mut()?, up.cpu()?, n),
            DeviceBackend::Cuda(b) => b.silu_mul(gate.cuda_mut()?, up.cuda()?, n),
        }
    }

    fn add(
        &self,
        residual: &mut DeviceBuffer,
        delta: &DeviceBuffer,
        n: usize,
    ) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cpu(b) => b.add(residual.cpu_mut()?, delta.cpu()?, n),
            DeviceBackend::Cuda(b) => b.add(residual.cuda_mut()?, delta.cuda()?, n),
        }
    }

    fn compact_rows(
        &self,
        buf: &mut DeviceBuffer,
        step: &DeviceStep,
        width: usize,
    ) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cpu(b) => b.compact_rows(buf.cpu_mut()?, step.cpu()?, width),
            DeviceBackend::Cuda(b) => b.compact_rows(buf.cuda_mut()?, step.cuda()?, width),
        }
    }

    fn read(
        &self,
        buf: &DeviceBuffer,
        n: usize,
        f: &mut dyn FnMut(&[f32]),
    ) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cpu(b) => b.read(buf.cpu()?, n, f),
            DeviceBackend::Cuda(b) => b.read(buf.cuda()?, n, f),
        }
    }

    fn argmax(
        &self,
        logits: &DeviceBuffer,
        rows: usize,
        vocab: usize,
        ids: &mut [u32],
    ) -> Result<(), BackendError> {
        match self {
            DeviceBackend::Cpu(b) => b.argmax(logits.cpu()?, rows, vocab, ids),
            DeviceBackend::Cuda(b) => b.argmax(logits.cuda()?, rows, vocab, ids),
        }
    }

    fn launches(&self) -> Option<u64> {
        match self {
            DeviceBackend::Cpu(b) => b.launches(),
            DeviceBackend::Cuda(b) => b.launches(),
        }
    }
}
