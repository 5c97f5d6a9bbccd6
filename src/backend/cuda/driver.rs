//! The CUDA driver through cudarc's thin `result` layer: one context (the
//! device's primary one) and one non-blocking stream, device and
//! host-mapped allocations that free themselves, copies and launches on
//! that stream. cudarc loads libcuda at run time and panics on a missing
//! library or symbol, so every first use goes through [`guarded`].

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;

use super::error::{CudaError, is_sticky};
use crate::host::gpu::GpuInfo;

/// Runs `f`, turning a panic of cudarc's loader (missing library or symbol)
/// into an error.
pub fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, CudaError>) -> Result<T, CudaError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(CudaError::Unavailable(format!(
            "the CUDA driver library lacks a symbol needed for {what} (driver too old?)"
        )))
    })
}

/// A driver call's error, named.
pub fn driver(call: &'static str) -> impl Fn(DriverError) -> CudaError {
    move |e| {
        let name = e
            .error_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("{:?}", e.0));
        if is_sticky(e.0) {
            CudaError::Fault {
                call,
                error: name,
                kernel: None,
            }
        } else {
            CudaError::Driver { call, error: name }
        }
    }
}

/// A raw driver handle that may cross threads: the driver API is
/// thread-safe once the owning context is current on the calling thread,
/// which [`Device::bind`] ensures before every use.
#[derive(Clone, Copy, Debug)]
pub struct Handle<T>(pub T);
// SAFETY: see above; the handles are opaque driver objects, not Rust data.
unsafe impl<T> Send for Handle<T> {}
// SAFETY: as for Send.
unsafe impl<T> Sync for Handle<T> {}

/// The device, its primary context and the stream everything runs on.
#[derive(Debug)]
pub struct Device {
    pub info: GpuInfo,
    pub multiprocessors: u32,
    pub shared_optin_bytes: u32,
    pub read_only_register: bool,
    /// Theoretical memory bandwidth from the memory clock and bus width,
    /// bytes/s (None where the driver reports neither, e.g. unified memory).
    pub peak_bandwidth: Option<f64>,
    device: Handle<sys::CUdevice>,
    context: Handle<sys::CUcontext>,
    stream: Handle<sys::CUstream>,
}

impl Device {
    /// Opens device `ordinal`: checks for the driver, retains its primary
    /// context and creates one non-blocking stream.
    pub fn open(ordinal: i32) -> Result<Arc<Device>, CudaError> {
        // SAFETY: only tries to dlopen libcuda; calls nothing in it.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::Unavailable(
                "no CUDA driver library (libcuda.so) found".to_string(),
            ));
        }
        guarded("opening the device", || Device::open_unguarded(ordinal))
    }

    fn open_unguarded(ordinal: i32) -> Result<Arc<Device>, CudaError> {
        result::init().map_err(driver("cuInit"))?;
        let count = result::device::get_count().map_err(driver("cuDeviceGetCount"))?;
        if count == 0 {
            return Err(CudaError::Unavailable(
                "the CUDA driver reports no devices".to_string(),
            ));
        }
        if ordinal < 0 || ordinal >= count {
            return Err(CudaError::Unavailable(format!(
                "no CUDA device {ordinal}: the driver reports {count}"
            )));
        }
        let device = result::device::get(ordinal).map_err(driver("cuDeviceGet"))?;
        use sys::CUdevice_attribute as A;
        let attr = |a: A| {
            // SAFETY: `device` was returned by cuDeviceGet above.
            unsafe { result::device::get_attribute(device, a) }
                .map_err(driver("cuDeviceGetAttribute"))
        };
        let info = GpuInfo {
            ordinal,
            name: result::device::get_name(device).map_err(driver("cuDeviceGetName"))?,
            compute_capability: (
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            integrated: attr(A::CU_DEVICE_ATTRIBUTE_INTEGRATED)? != 0,
            pageable_memory_access: attr(A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)? != 0,
            // SAFETY: `device` was returned by cuDeviceGet above.
            total_memory: unsafe { result::device::total_mem(device) }
                .map_err(driver("cuDeviceTotalMem"))? as u64,
        };
        let multiprocessors = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as u32;
        let shared_optin_bytes =
            attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?.max(0) as u32;
        let read_only_register =
            attr(A::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED)? != 0;
        // kHz × 2 (double data rate) × bus bytes.
        let clock_khz = attr(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE).unwrap_or(0);
        let bus_bits = attr(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH).unwrap_or(0);
        let peak_bandwidth = (clock_khz > 0 && bus_bits > 0)
            .then(|| clock_khz as f64 * 1e3 * 2.0 * bus_bits as f64 / 8.0);
        // SAFETY: `device` is valid; the retained context is released in Drop.
        let context = unsafe { result::primary_ctx::retain(device) }
            .map_err(driver("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: `context` was just retained.
        unsafe { result::ctx::set_current(context) }.map_err(driver("cuCtxSetCurrent"))?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(driver("cuStreamCreate"))?;
        Ok(Arc::new(Device {
            info,
            multiprocessors,
            shared_optin_bytes,
            read_only_register,
            peak_bandwidth,
            device: Handle(device),
            context: Handle(context),
            stream: Handle(stream),
        }))
    }

    /// Makes the context current on the calling thread (cheap; the engine
    /// may run on another thread than the one that opened the device).
    pub fn bind(&self) -> Result<(), CudaError> {
        // SAFETY: the context is retained for as long as `self` lives.
        unsafe { result::ctx::set_current(self.context.0) }.map_err(driver("cuCtxSetCurrent"))
    }

    pub fn stream(&self) -> sys::CUstream {
        self.stream.0
    }

    /// Waits for everything queued on the stream.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        // SAFETY: the stream lives as long as `self`.
        unsafe { result::stream::synchronize(self.stream.0) }.map_err(driver("cuStreamSynchronize"))
    }

    /// Copies `src` to device address `dst` on the stream. From pageable
    /// memory the driver stages the bytes before returning, so `src` may be
    /// reused at once.
    pub fn upload<T: Copy>(&self, dst: u64, src: &[T]) -> Result<(), CudaError> {
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: callers pass a device range at least `size_of_val(src)`
        // long that they own (DeviceMemory checks the length).
        unsafe { result::memcpy_htod_async(dst, src, self.stream.0) }
            .map_err(driver("cuMemcpyHtoDAsync"))
    }

    /// Copies device bytes at `src` into `dst` and waits for them.
    pub fn download<T: Copy>(&self, dst: &mut [T], src: u64) -> Result<(), CudaError> {
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: callers pass a device range at least `size_of_val(dst)` long.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.0) }
            .map_err(driver("cuMemcpyDtoHAsync"))?;
        self.synchronize()
    }

    /// Zeroes `bytes` at device address `dst`.
    pub fn zero(&self, dst: u64, bytes: usize) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: callers pass a device range they own.
        unsafe { result::memset_d8_async(dst, 0, bytes, self.stream.0) }
            .map_err(driver("cuMemsetD8Async"))
    }

    /// Launches `function` with one by-value parameter struct.
    pub fn launch<P>(
        &self,
        function: sys::CUfunction,
        grid: (u32, u32, u32),
        block: u32,
        shared_bytes: u32,
        params: &P,
    ) -> Result<(), CudaError> {
        let mut args = [params as *const P as *mut c_void];
        // SAFETY: `function` comes from a loaded module; its one parameter
        // is the struct `P` mirrors (params.rs, checked by size on both
        // sides); the driver copies the parameter before returning. The
        // device addresses inside are owned by live allocations.
        unsafe {
            result::launch_kernel(
                function,
                grid,
                (block, 1, 1),
                shared_bytes,
                self.stream.0,
                &mut args,
            )
        }
        .map_err(driver("cuLaunchKernel"))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: the stream and the retained context belong to this struct;
        // every allocation holds an Arc<Device>, so none outlives them.
        unsafe {
            let _ = result::ctx::set_current(self.context.0);
            let _ = result::stream::synchronize(self.stream.0);
            let _ = result::stream::destroy(self.stream.0);
            let _ = result::primary_ctx::release(self.device.0);
        }
    }
}

/// Device memory from `cuMemAlloc`, freed on drop.
#[derive(Debug)]
pub struct DeviceMemory {
    device: Arc<Device>,
    ptr: Handle<sys::CUdeviceptr>,
    bytes: usize,
}

impl DeviceMemory {
    /// `bytes` of zeroed device memory.
    pub fn zeroed(device: &Arc<Device>, bytes: usize) -> Result<DeviceMemory, CudaError> {
        let memory = DeviceMemory::uninit(device, bytes)?;
        device.zero(memory.ptr(), bytes)?;
        Ok(memory)
    }

    /// `bytes` of device memory the caller fills before reading.
    pub fn uninit(device: &Arc<Device>, bytes: usize) -> Result<DeviceMemory, CudaError> {
        // cuMemAlloc refuses 0 bytes; keep a valid (unused) address anyway.
        let size = bytes.max(1);
        // SAFETY: a plain allocation; freed exactly once in Drop.
        let ptr = unsafe { result::malloc_sync(size) }.map_err(|e| {
            let name = e
                .error_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            CudaError::OutOfMemory {
                bytes: size as u64,
                error: name,
            }
        })?;
        Ok(DeviceMemory {
            device: Arc::clone(device),
            ptr: Handle(ptr),
            bytes,
        })
    }

    pub fn ptr(&self) -> u64 {
        self.ptr.0
    }

    /// Copies `src` to the start of this allocation.
    pub fn upload<T: Copy>(&self, src: &[T]) -> Result<(), CudaError> {
        self.upload_at(0, src)
    }

    /// Copies `src` to byte `offset` of this allocation.
    pub fn upload_at<T: Copy>(&self, offset: usize, src: &[T]) -> Result<(), CudaError> {
        let len = std::mem::size_of_val(src);
        if offset.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(CudaError::Bounds(format!(
                "{len} bytes at {offset} into an allocation of {}",
                self.bytes
            )));
        }
        self.device.upload(self.ptr.0 + offset as u64, src)
    }

    /// Copies the start of this allocation into `dst` and waits.
    pub fn download<T: Copy>(&self, dst: &mut [T]) -> Result<(), CudaError> {
        let len = std::mem::size_of_val(dst);
        if len > self.bytes {
            return Err(CudaError::Bounds(format!(
                "{len} bytes from an allocation of {}",
                self.bytes
            )));
        }
        self.device.download(dst, self.ptr.0)
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc in `zeroed`, freed once here, after
        // the stream has finished any work that could still use it.
        unsafe {
            let _ = self.device.bind();
            let _ = result::stream::synchronize(self.device.stream());
            let _ = result::free_sync(self.ptr.0);
        }
    }
}

/// Page-locked host memory the device writes directly (`cuMemHostAlloc`
/// with DEVICEMAP): the logits, read by the host after one stream sync
/// without a second copy.
#[derive(Debug)]
pub struct HostMapped {
    device: Arc<Device>,
    host: Handle<*mut c_void>,
    device_ptr: u64,
    bytes: usize,
}

impl HostMapped {
    pub fn zeroed(device: &Arc<Device>, bytes: usize) -> Result<HostMapped, CudaError> {
        let size = bytes.max(4);
        // SAFETY: a plain allocation; freed once in Drop.
        let host =
            unsafe { result::malloc_host(size, sys::CU_MEMHOSTALLOC_DEVICEMAP) }.map_err(|e| {
                let name = e
                    .error_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                CudaError::OutOfMemory {
                    bytes: size as u64,
                    error: name,
                }
            })?;
        // SAFETY: `host` points to `size` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(host as *mut u8, 0, size) };
        let mut device_ptr: sys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated with DEVICEMAP in this context.
        let mapped =
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, host, 0) }.result();
        let memory = HostMapped {
            device: Arc::clone(device),
            host: Handle(host),
            device_ptr,
            bytes,
        };
        mapped.map_err(driver("cuMemHostGetDevicePointer"))?;
        Ok(memory)
    }

    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
    }

    /// The values, once the stream has finished writing them.
    pub fn read_f32(&self, n: usize) -> Result<&[f32], CudaError> {
        if n * 4 > self.bytes {
            return Err(CudaError::Bounds(format!(
                "{n} f32 from {} bytes",
                self.bytes
            )));
        }
        self.device.synchronize()?;
        // SAFETY: the allocation holds `bytes` bytes, 4-aligned (page-aligned
        // by the driver), initialised (zeroed at allocation); the device
        // wrote them before the synchronize above and no work is queued
        // while the borrow of `self` lasts.
        Ok(unsafe { std::slice::from_raw_parts(self.host.0 as *const f32, n) })
    }
}

impl Drop for HostMapped {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc in `zeroed`, freed once here
        // after the stream is idle.
        unsafe {
            let _ = self.device.bind();
            let _ = result::stream::synchronize(self.device.stream());
            let _ = result::free_host(self.host.0);
        }
    }
}

/// A host range registered with the device (`cuMemHostRegister`),
/// unregistered on drop.
#[derive(Debug)]
pub struct Registration {
    device: Arc<Device>,
    host: Handle<*mut c_void>,
    pub device_ptr: u64,
}

impl Registration {
    /// Registers `bytes` at `host` (page-aligned) read-only and returns the
    /// device address of its first byte.
    ///
    /// # Safety
    /// `host..host + bytes` must stay mapped for the life of the result.
    pub unsafe fn register(
        device: &Arc<Device>,
        host: *mut c_void,
        bytes: usize,
    ) -> Result<Registration, CudaError> {
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_READ_ONLY;
        // SAFETY: the caller keeps the range mapped; the driver only pins it.
        unsafe { sys::cuMemHostRegister_v2(host, bytes, flags) }
            .result()
            .map_err(driver("cuMemHostRegister"))?;
        // From here on, Drop unregisters.
        let mut registration = Registration {
            device: Arc::clone(device),
            host: Handle(host),
            device_ptr: 0,
        };
        // SAFETY: `host` was registered with DEVICEMAP just above.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut registration.device_ptr, host, 0) }
            .result()
            .map_err(driver("cuMemHostGetDevicePointer"))?;
        Ok(registration)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, unregistered once here after the
        // stream is idle.
        unsafe {
            let _ = self.device.bind();
            let _ = result::stream::synchronize(self.device.stream());
            let _ = sys::cuMemHostUnregister(self.host.0);
        }
    }
}
