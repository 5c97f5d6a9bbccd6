//! Making the mapped checkpoint readable by the device, once, and turning
//! a weight's host slice into a device address.
//!
//! On an integrated GPU (one memory pool) the weights are used in place:
//! the mapping is registered read-only with the driver, or, where the
//! device reads pageable memory directly, used as it is. Otherwise (a
//! discrete GPU, or registration refused) every region is copied once into
//! one device allocation; the caller then releases the page cache.

use std::sync::Arc;

use super::driver::{Device, DeviceMemory, Registration};
use super::error::CudaError;
use crate::backend::error::BackendError;
use crate::plan::ledger::{Category, Charge, Ledger, WeightsResidency};

/// How the weights may reach the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightsPolicy {
    /// In place on an integrated GPU when the driver allows, else a copy.
    Auto,
    /// Always one device copy.
    Copy,
}

/// Bytes per copy call (and per progress step).
const COPY_CHUNK: usize = 64 << 20;

#[derive(Clone, Copy, Debug)]
struct Region {
    host: usize,
    len: usize,
    device: u64,
}

/// The attached weight regions and whatever keeps them readable.
#[derive(Debug, Default)]
pub struct WeightStore {
    regions: Vec<Region>,
    residency: Option<WeightsResidency>,
    _copy: Option<DeviceMemory>,
    _registrations: Vec<Registration>,
    _charge: Option<Charge>,
}

impl WeightStore {
    pub fn residency(&self) -> Option<WeightsResidency> {
        self.residency
    }

    /// Attaches `regions` (host byte ranges every weight lies in), charging
    /// their total to the ledger's weights.
    pub fn attach(
        device: &Arc<Device>,
        ledger: &Arc<Ledger>,
        regions: &[&[u8]],
        policy: WeightsPolicy,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<WeightStore, BackendError> {
        let total: usize = regions.iter().map(|r| r.len()).sum();
        let charge = ledger.charge(
            Category::Weights,
            total as u64,
            crate::plan::ledger::WEIGHTS,
        )?;
        let mut sorted: Vec<&[u8]> = regions.iter().copied().filter(|r| !r.is_empty()).collect();
        sorted.sort_by_key(|r| r.as_ptr() as usize);
        if sorted
            .windows(2)
            .any(|w| w[0].as_ptr() as usize + w[0].len() > w[1].as_ptr() as usize)
        {
            return Err(BackendError::Shape("weight regions overlap".to_string()));
        }

        let info = &device.info;
        if policy == WeightsPolicy::Auto && info.integrated {
            if device.read_only_register {
                match register(device, &sorted) {
                    Ok((regions, registrations)) => {
                        return Ok(WeightStore {
                            regions,
                            residency: Some(WeightsResidency::HostRegistered),
                            _copy: None,
                            _registrations: registrations,
                            _charge: Some(charge),
                        });
                    }
                    Err(e) => tracing::info!("weights: registering the mapping failed ({e})"),
                }
            }
            if info.pageable_memory_access {
                // The device reads the process's pageable memory directly.
                let regions = sorted
                    .iter()
                    .map(|r| Region {
                        host: r.as_ptr() as usize,
                        len: r.len(),
                        device: r.as_ptr() as u64,
                    })
                    .collect();
                return Ok(WeightStore {
                    regions,
                    residency: Some(WeightsResidency::Mapped),
                    _copy: None,
                    _registrations: Vec::new(),
                    _charge: Some(charge),
                });
            }
        }

        let copy = DeviceMemory::uninit(device, total)?;
        let mut out = Vec::with_capacity(sorted.len());
        let mut offset = 0usize;
        let mut done = 0u64;
        progress(0, total as u64);
        for region in &sorted {
            for (i, chunk) in region.chunks(COPY_CHUNK).enumerate() {
                copy.upload_at(offset + i * COPY_CHUNK, chunk)?;
                done += chunk.len() as u64;
                progress(done, total as u64);
            }
            out.push(Region {
                host: region.as_ptr() as usize,
                len: region.len(),
                device: copy.ptr() + offset as u64,
            });
            offset += region.len();
        }
        device.synchronize()?;
        Ok(WeightStore {
            regions: out,
            residency: Some(WeightsResidency::DeviceCopy),
            _copy: Some(copy),
            _registrations: Vec::new(),
            _charge: Some(charge),
        })
    }

    /// The device address of `bytes`' first byte (0 for an empty slice).
    pub fn translate(&self, bytes: &[u8]) -> Result<u64, BackendError> {
        if bytes.is_empty() {
            return Ok(0);
        }
        let start = bytes.as_ptr() as usize;
        let i = self.regions.partition_point(|r| r.host <= start);
        let region = i
            .checked_sub(1)
            .map(|i| self.regions[i])
            .filter(|r| start + bytes.len() <= r.host + r.len)
            .ok_or_else(|| {
                BackendError::Shape(format!(
                    "a weight of {} bytes lies outside every region attached to the CUDA backend",
                    bytes.len()
                ))
            })?;
        Ok(region.device + (start - region.host) as u64)
    }
}

/// Registers the pages under `regions` (merged where they share pages).
fn register(
    device: &Arc<Device>,
    regions: &[&[u8]],
) -> Result<(Vec<Region>, Vec<Registration>), CudaError> {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096);
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for r in regions {
        let start = (r.as_ptr() as usize) / page * page;
        let end = (r.as_ptr() as usize + r.len()).div_ceil(page) * page;
        match ranges.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => ranges.push((start, end)),
        }
    }
    let mut registrations = Vec::with_capacity(ranges.len());
    for &(start, end) in &ranges {
        // SAFETY: the pages lie in mappings (the checkpoint's files or the
        // caller's buffers) that outlive the backend; Drop unregisters them.
        registrations
            .push(unsafe { Registration::register(device, start as *mut _, end - start)? });
    }
    let out = regions
        .iter()
        .map(|r| {
            let host = r.as_ptr() as usize;
            let at = ranges.partition_point(|&(s, _)| s <= host) - 1;
            Region {
                host,
                len: r.len(),
                device: registrations[at].device_ptr + (host - ranges[at].0) as u64,
            }
        })
        .collect();
    Ok((out, registrations))
}
