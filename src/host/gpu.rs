//! GPU facts from the CUDA driver, loaded dynamically: sparkrt builds and runs
//! on hosts with no CUDA at all, and says so instead of failing.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub ordinal: i32,
    pub name: String,
    /// Compute capability, e.g. (12, 1) on a GB10, (9, 0) on an H200.
    pub compute_capability: (i32, i32),
    /// An integrated GPU shares the host's memory pool (unified memory).
    pub integrated: bool,
    /// Whether the device reads pageable host memory directly (no registration needed).
    pub pageable_memory_access: bool,
    /// Device memory the driver reports, bytes (on an integrated GPU, the host pool).
    pub total_memory: u64,
}

impl GpuInfo {
    /// `sm_121`, `sm_90`, ...: the NVRTC architecture of this device.
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}

/// What looking for a GPU found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum GpuProbe {
    Present { devices: Vec<GpuInfo> },
    Absent { reason: String },
}

impl GpuProbe {
    pub fn first(&self) -> Option<&GpuInfo> {
        match self {
            GpuProbe::Present { devices } => devices.first(),
            GpuProbe::Absent { .. } => None,
        }
    }
}

/// Asks the CUDA driver (if one is installed) which devices there are.
pub fn probe() -> GpuProbe {
    // SAFETY: only tries to dlopen libcuda; no symbol of it is called here.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return GpuProbe::Absent {
            reason: "no CUDA driver library (libcuda.so) found".to_string(),
        };
    }
    // cudarc panics when a symbol is missing from an old driver; turn that
    // into an answer instead of a crash.
    match std::panic::catch_unwind(query_devices) {
        Ok(Ok(devices)) if devices.is_empty() => GpuProbe::Absent {
            reason: "the CUDA driver reports no devices".to_string(),
        },
        Ok(Ok(devices)) => GpuProbe::Present { devices },
        Ok(Err(reason)) => GpuProbe::Absent { reason },
        Err(_) => GpuProbe::Absent {
            reason: "the CUDA driver library lacks a required symbol (driver too old?)".to_string(),
        },
    }
}

fn query_devices() -> Result<Vec<GpuInfo>, String> {
    use cudarc::driver::result::{device, init};
    use cudarc::driver::sys::CUdevice_attribute as Attr;

    init().map_err(|e| format!("cuInit failed: {e}"))?;
    let count = device::get_count().map_err(|e| format!("cuDeviceGetCount failed: {e}"))?;
    let mut devices = Vec::new();
    for ordinal in 0..count {
        let dev = device::get(ordinal).map_err(|e| format!("cuDeviceGet({ordinal}): {e}"))?;
        let attr = |a: Attr| {
            // SAFETY: `dev` was returned by cuDeviceGet above.
            unsafe { device::get_attribute(dev, a) }
                .map_err(|e| format!("cuDeviceGetAttribute({a:?}): {e}"))
        };
        devices.push(GpuInfo {
            ordinal,
            name: device::get_name(dev).map_err(|e| format!("cuDeviceGetName: {e}"))?,
            compute_capability: (
                attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            integrated: attr(Attr::CU_DEVICE_ATTRIBUTE_INTEGRATED)? != 0,
            pageable_memory_access: attr(Attr::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)? != 0,
            // SAFETY: `dev` was returned by cuDeviceGet above.
            total_memory: unsafe { device::total_mem(dev) }
                .map_err(|e| format!("cuDeviceTotalMem: {e}"))? as u64,
        });
    }
    Ok(devices)
}
