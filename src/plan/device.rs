//! The backend a plan is made for.

use serde::Serialize;

use super::profile::DeviceKind;

/// The backend a plan is made for (after `auto` is resolved).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanDevice {
    Cpu,
    Cuda,
}

impl PlanDevice {
    pub fn name(self) -> &'static str {
        match self {
            PlanDevice::Cpu => "cpu",
            PlanDevice::Cuda => "cuda",
        }
    }

    pub fn resolve(kind: DeviceKind, gpu_present: bool) -> PlanDevice {
        match kind {
            DeviceKind::Cpu => PlanDevice::Cpu,
            DeviceKind::Cuda => PlanDevice::Cuda,
            DeviceKind::Auto if gpu_present => PlanDevice::Cuda,
            DeviceKind::Auto => PlanDevice::Cpu,
        }
    }
}
