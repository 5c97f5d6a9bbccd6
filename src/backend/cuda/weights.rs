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

/// How the weights may reach the device (`--weights-policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightsPolicy {
    /// In place on an integrated GPU when the driver allows (registered,
    /// else pageable memory read directly), else a copy.
    #[default]
    Auto,
    /// Always one device copy.
    Copy,
    /// The mapping registered with the driver and read in place; refused
    /// where the driver will not register it.
    Register,
    /// The pageable mapping read directly; refused on a device that cannot.
    Map,
}

impl WeightsPolicy {
    pub fn name(self) -> &'static str {
        match self {
            WeightsPolicy::Auto => "auto",
            WeightsPolicy::Copy => "copy",
            WeightsPolicy::Register => "register",
            WeightsPolicy::Map => "map",
        }
    }
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
    /// their total to the ledger's weights. A copy hands each chunk to
    /// `release` once the device has it, so the caller can drop its pages
    /// and the host never holds the checkpoint twice.
    pub fn attach(
        device: &Arc<Device>,
        ledger: &Arc<Ledger>,
        regions: &[&[u8]],
        policy: WeightsPolicy,
        progress: &mut dyn FnMut(u64, u64),
        release: &mut dyn FnMut(&[u8]),
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
        let refused = |why: String| {
            BackendError::Unavailable(format!("--weights-policy {}: {why}", policy.name()))
        };
        match policy {
            WeightsPolicy::Register => {
                if !device.read_only_register {
                    return Err(refused(
                        "the driver cannot register read-only memory (the checkpoint's mapping)"
                            .to_string(),
                    ));
                }
                let (regions, registrations) = register(device, &sorted)
                    .map_err(|e| refused(format!("registering the mapping failed: {e}")))?;
                return Ok(WeightStore::in_place(
                    regions,
                    WeightsResidency::HostRegistered,
                    registrations,
                    charge,
                ));
            }
            WeightsPolicy::Map => {
                if !info.pageable_memory_access {
                    return Err(refused(
                        "this device does not read pageable host memory".to_string(),
                    ));
                }
                return Ok(WeightStore::in_place(
                    pageable(&sorted),
                    WeightsResidency::Mapped,
                    Vec::new(),
                    charge,
                ));
            }
            WeightsPolicy::Auto if info.integrated => {
                if device.read_only_register {
                    match register(device, &sorted) {
                        Ok((regions, registrations)) => {
                            return Ok(WeightStore::in_place(
                                regions,
                                WeightsResidency::HostRegistered,
                                registrations,
                                charge,
                            ));
                        }
                        Err(e) => tracing::info!("weights: registering the mapping failed ({e})"),
                    }
                }
                if info.pageable_memory_access {
                    return Ok(WeightStore::in_place(
                        pageable(&sorted),
                        WeightsResidency::Mapped,
                        Vec::new(),
                        charge,
                    ));
                }
            }
            WeightsPolicy::Auto | WeightsPolicy::Copy => {}
        }

        let copy = DeviceMemory::uninit(device, total)?;
        let mut out = Vec::with_capacity(sorted.len());
        let mut offset = 0usize;
        let mut done = 0u64;
        progress(0, total as u64);
        for region in &sorted {
            for (i, chunk) in region.chunks(COPY_CHUNK).enumerate() {
                copy.upload_at(offset + i * COPY_CHUNK, chunk)?;
                // The upload of pageable memory has returned: the device
                // holds the chunk.
                release(chunk);
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

    /// Weights the device reads where they are.
    fn in_place(
        regions: Vec<Region>,
        residency: WeightsResidency,
        registrations: Vec<Registration>,
        charge: Charge,
    ) -> WeightStore {
        WeightStore {
            regions,
            residency: Some(residency),
            _copy: None,
            _registrations: registrations,
            _charge: Some(charge),
        }
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

/// `regions` read by the device at their host addresses (pageable memory
/// access).
fn pageable(regions: &[&[u8]]) -> Vec<Region> {
    regions
        .iter()
        .map(|r| Region {
            host: r.as_ptr() as usize,
            len: r.len(),
            device: r.as_ptr() as u64,
        })
        .collect()
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
