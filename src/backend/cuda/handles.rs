//! The weights as the CUDA ops take them, borrowed from the checkpoint: a
//! linear weight's kernel descriptor, a vector's device address.

use std::marker::PhantomData;

use super::params as p;

/// A linear weight as the kernels read it, borrowed from the checkpoint.
#[derive(Clone, Copy, Debug)]
pub struct CudaLinear<'w> {
    pub(crate) weight: p::Weight,
    pub rows: usize,
    pub cols: usize,
    pub(super) _borrow: PhantomData<&'w [u8]>,
}

/// A vector weight (norm, bias, sinks) in device-readable memory.
#[derive(Clone, Copy, Debug)]
pub struct CudaVector<'w> {
    pub(crate) ptr: u64,
    pub len: usize,
    pub(crate) bf16: bool,
    pub(super) _borrow: PhantomData<&'w [u8]>,
}
