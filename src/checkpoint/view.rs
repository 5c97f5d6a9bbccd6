//! Zero-copy views of mapped tensors.
//!
//! safetensors gives no alignment guarantee (the data starts right after a
//! JSON header of any length), so typed access never reinterprets the bytes as
//! `&[u16]` or `&[f32]`: elements are decoded one at a time from little-endian
//! bytes, which is defined behaviour at any address and compiles to plain
//! unaligned loads.

use std::marker::PhantomData;
use std::path::Path;

use half::{bf16, f16};

use super::dtype::Dtype;
use super::error::CheckpointError;
use super::header_set::TensorInfo;

/// One tensor's bytes, borrowed from the checkpoint's mapping.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    info: &'a TensorInfo,
    path: &'a Path,
    bytes: &'a [u8],
}

impl<'a> TensorView<'a> {
    pub(crate) fn new(info: &'a TensorInfo, path: &'a Path, bytes: &'a [u8]) -> Self {
        TensorView { info, path, bytes }
    }

    pub fn name(&self) -> &'a str {
        &self.info.name
    }

    pub fn dtype(&self) -> Dtype {
        self.info.dtype
    }

    pub fn shape(&self) -> &'a [usize] {
        &self.info.shape
    }

    /// The file holding the tensor.
    pub fn path(&self) -> &'a Path {
        self.path
    }

    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        self.bytes.len() / self.info.dtype.size()
    }

    /// The raw little-endian bytes (possibly misaligned).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Typed elements, if the tensor's dtype is `T`'s.
    pub fn elements<T: Element>(&self) -> Result<Elements<'a, T>, CheckpointError> {
        self.expect_dtype(T::DTYPE)?;
        Ok(Elements::new(self.bytes))
    }

    pub fn bf16(&self) -> Result<Elements<'a, bf16>, CheckpointError> {
        self.elements()
    }

    pub fn f16(&self) -> Result<Elements<'a, f16>, CheckpointError> {
        self.elements()
    }

    pub fn f32(&self) -> Result<Elements<'a, f32>, CheckpointError> {
        self.elements()
    }

    pub fn i64(&self) -> Result<Elements<'a, i64>, CheckpointError> {
        self.elements()
    }

    pub fn f8_e4m3(&self) -> Result<Elements<'a, F8E4M3>, CheckpointError> {
        self.elements()
    }

    /// U8 data is always aligned, so it is a plain slice.
    pub fn u8(&self) -> Result<&'a [u8], CheckpointError> {
        self.expect_dtype(Dtype::U8)?;
        Ok(self.bytes)
    }

    /// The value of a one-element F32 tensor (shape `[]` or `[1]`), such as
    /// NVFP4's `weight_scale_2`.
    pub fn scalar_f32(&self) -> Result<f32, CheckpointError> {
        let elements = self.f32()?;
        match (elements.len(), elements.get(0)) {
            (1, Some(value)) => Ok(value),
            _ => Err(self.wrong_shape("a single element")),
        }
    }

    /// Fails unless the tensor has dtype `expected`.
    pub fn expect_dtype(&self, expected: Dtype) -> Result<(), CheckpointError> {
        if self.info.dtype == expected {
            Ok(())
        } else {
            Err(CheckpointError::WrongDtype {
                path: self.path.to_path_buf(),
                tensor: self.info.name.clone(),
                found: self.info.dtype,
                expected: expected.to_string(),
            })
        }
    }

    /// Fails unless the tensor has exactly `expected` shape.
    pub fn expect_shape(&self, expected: &[usize]) -> Result<(), CheckpointError> {
        if self.info.shape == expected {
            Ok(())
        } else {
            Err(self.wrong_shape(&format!("{expected:?}")))
        }
    }

    pub(crate) fn wrong_shape(&self, expected: &str) -> CheckpointError {
        CheckpointError::WrongShape {
            path: self.path.to_path_buf(),
            tensor: self.info.name.clone(),
            found: self.info.shape.clone(),
            expected: expected.to_string(),
        }
    }
}

/// An element type readable from little-endian bytes at any alignment.
pub trait Element: Copy {
    const DTYPE: Dtype;
    /// Decodes the element stored in the first `DTYPE.size()` bytes, if there
    /// are that many.
    fn read(bytes: &[u8]) -> Option<Self>;
}

impl Element for bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
    fn read(bytes: &[u8]) -> Option<Self> {
        bytes.first_chunk().map(|b| bf16::from_le_bytes(*b))
    }
}

impl Element for f16 {
    const DTYPE: Dtype = Dtype::F16;
    fn read(bytes: &[u8]) -> Option<Self> {
        bytes.first_chunk().map(|b| f16::from_le_bytes(*b))
    }
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn read(bytes: &[u8]) -> Option<Self> {
        bytes.first_chunk().map(|b| f32::from_le_bytes(*b))
    }
}

impl Element for i64 {
    const DTYPE: Dtype = Dtype::I64;
    fn read(bytes: &[u8]) -> Option<Self> {
        bytes.first_chunk().map(|b| i64::from_le_bytes(*b))
    }
}

impl Element for u8 {
    const DTYPE: Dtype = Dtype::U8;
    fn read(bytes: &[u8]) -> Option<Self> {
        bytes.first().copied()
    }
}

/// One FP8 E4M3 (`e4m3fn`) value, kept as its byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct F8E4M3(pub u8);

impl F8E4M3 {
    pub fn to_f32(self) -> f32 {
        crate::formats::e4m3_to_f32(self.0)
    }
}

impl Element for F8E4M3 {
    const DTYPE: Dtype = Dtype::F8E4M3;
    fn read(bytes: &[u8]) -> Option<Self> {
        bytes.first().map(|&b| F8E4M3(b))
    }
}

/// The elements of a tensor, decoded on access from borrowed bytes.
#[derive(Clone, Copy, Debug)]
pub struct Elements<'a, T> {
    bytes: &'a [u8],
    element: PhantomData<T>,
}

impl<'a, T: Element> Elements<'a, T> {
    /// Views `bytes` as elements of `T`; a trailing partial element is ignored.
    pub fn new(bytes: &'a [u8]) -> Self {
        Elements {
            bytes,
            element: PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.bytes.len() / T::DTYPE.size()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> Option<T> {
        let size = T::DTYPE.size();
        T::read(self.bytes.get(i.checked_mul(size)?..)?)
    }

    pub fn iter(&self) -> ElementIter<'a, T> {
        ElementIter {
            rest: self.bytes,
            element: PhantomData,
        }
    }

    /// The raw bytes behind the elements.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// A copy of the elements (for tests and small tensors; weights are read
    /// in place).
    pub fn to_vec(&self) -> Vec<T> {
        self.iter().collect()
    }
}

/// Iterator over [`Elements`], decoding each element as it goes.
#[derive(Clone, Debug)]
pub struct ElementIter<'a, T> {
    rest: &'a [u8],
    element: PhantomData<T>,
}

impl<T: Element> Iterator for ElementIter<'_, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        let size = T::DTYPE.size();
        if self.rest.len() < size {
            return None;
        }
        let (head, tail) = self.rest.split_at(size);
        self.rest = tail;
        T::read(head)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.rest.len() / T::DTYPE.size();
        (n, Some(n))
    }
}

impl<T: Element> ExactSizeIterator for ElementIter<'_, T> {}
